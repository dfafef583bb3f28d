"""ft-supervisor: a per-node daemon that keeps distributed PyTorch training alive.

Kept import-free on purpose: ranks import ``supervisor.process.bootstrap`` and
``supervisor.client`` through this package, and must not pay for the daemon.
"""

__version__ = "0.1.0"
