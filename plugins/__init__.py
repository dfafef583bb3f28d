"""Built-in failure classifiers, registered through the same entry-point group
(``ft_supervisor.plugins``) a third-party plugin uses."""
