"""What the daemon writes down: the event log, the run directory, learned
state, the reason file and the failure text."""
