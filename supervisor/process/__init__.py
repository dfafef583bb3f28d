"""Spawning, watching and terminating rank processes; gathering their evidence."""
