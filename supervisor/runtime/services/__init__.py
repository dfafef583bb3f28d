"""What the daemon offers beside the ranks: control socket, status, events
publisher, metrics, sd_notify, the loop's own watchdog."""
