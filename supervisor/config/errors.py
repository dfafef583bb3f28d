"""The one error a bad option, variable or configuration file raises."""


class ConfigError(ValueError):
    """Bad input: the message names the option (or file) and what it expects."""
