"""Pure decision logic: values, state tables, policy. Standard library only.

Nothing here does I/O, reads a clock or imports asyncio, os, zmq or torch: time
comes in as a parameter, so every rule is unit-tested without processes.
"""
