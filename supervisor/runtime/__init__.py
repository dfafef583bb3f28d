"""The daemon: one asyncio loop that gathers evidence and applies decisions."""
