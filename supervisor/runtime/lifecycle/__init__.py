"""The daemon's loop and a generation's life: launch, watch, judge, end."""
