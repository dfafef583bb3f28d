"""What a rank imports as ``nvidia_resiliency_ext.fault_tolerance`` under ft-supervisor.

The rank bootstrap (``supervisor.process.bootstrap``) runs this file under
NVRx's module names (the package, and its ``rank_monitor_client``), so code
written for NVRx (its examples, its Lightning callbacks, Megatron-LM's
``--enable-ft-package``) gets ``supervisor.client.nvrx`` unchanged. As the
package, its ``__path__`` is NVRx's own ``fault_tolerance`` directory: the
submodules it does not replace (``config``, ``data``, ``utils``...) are
NVRx's own files, and the package's other names (``FaultToleranceConfig``,
``RankMonitorServer``...) are NVRx's own, imported when first used.

Importing it by its own name defines the same names but serves nothing.
"""

from __future__ import annotations

import importlib
from importlib import metadata

from supervisor.client.nvrx import (
    HeartbeatTimeouts,
    RankMonitorClient,
    RankMonitorClientError,
    SectionTimeouts,
    WorkloadAction,
    WorkloadControlRequest,
    serve_as_nvrx,
)

__all__ = [
    "HeartbeatTimeouts",
    "RankMonitorClient",
    "RankMonitorClientError",
    "SectionTimeouts",
    "WorkloadAction",
    "WorkloadControlRequest",
]

NVRX = "nvidia_resiliency_ext.fault_tolerance"
DISTRIBUTION = "nvidia-resiliency-ext"

# the rest of NVRx's package names: its own, from the submodule that defines each
_NVRX_OWN = {
    "FaultToleranceConfig": "config",
    "RankMonitorServer": "rank_monitor_server",
    "InvalidStateTransitionException": "rank_monitor_state_machine",
    "RankMonitorState": "rank_monitor_state_machine",
    "RankMonitorStateMachine": "rank_monitor_state_machine",
}


def _version() -> str | None:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def __getattr__(name: str) -> object:
    submodule = _NVRX_OWN.get(name)
    if submodule is None or __package__ != NVRX:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{NVRX}.{submodule}"), name)


if __name__ == NVRX or __name__.startswith(NVRX + "."):
    serve_as_nvrx(_version())
