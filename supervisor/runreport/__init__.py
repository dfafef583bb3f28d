"""A run's report (text and HTML) from its event logs; the command is in supervisor.cli.report."""
