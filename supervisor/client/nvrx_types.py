"""nvidia-resiliency-ext's value types, by NVRx's names: the timeouts its client shows,
its client's configuration, and the workload control requests a rank may send.

Re-exported by ``supervisor.client.nvrx`` (and so by what a rank imports as
``nvidia_resiliency_ext.fault_tolerance``), where code written for NVRx finds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from supervisor.transport.messages import RequestAction


@dataclass
class HeartbeatTimeouts:
    """NVRx's heartbeat timeouts: ``initial`` (to the first heartbeat), ``subsequent`` (between)."""

    initial: float | None = None
    subsequent: float | None = None
    were_calculated: bool | None = None

    @property
    def are_valid(self) -> bool:
        return self.initial is not None and self.subsequent is not None


@dataclass
class SectionTimeouts:
    """NVRx's section timeouts; ``calculated_sections`` were learned, not configured."""

    section: Mapping[str, float | None] = field(default_factory=dict)
    out_of_section: float | None = None
    calculated_sections: set[str] = field(default_factory=set)
    is_out_of_section_calculated: bool = False

    def __post_init__(self) -> None:
        self.calculated_sections = set(self.calculated_sections)

    @property
    def were_calculated(self) -> bool:
        return self.calculated_sections == set(self.section) and self.is_out_of_section_calculated

    @property
    def are_valid(self) -> bool:
        return all(t is not None for t in self.section.values()) and self.out_of_section is not None


@dataclass(frozen=True)
class ClientConfig:
    """The timeouts part of NVRx's ``FaultToleranceConfig`` (``RankMonitorClient.cfg``, which
    NVRx's launcher hands its client at init): here those in force for this rank."""

    initial_rank_heartbeat_timeout: float | None = None
    rank_heartbeat_timeout: float | None = None
    rank_section_timeouts: Mapping[str, float | None] = field(default_factory=dict)
    rank_out_of_section_timeout: float | None = None


class WorkloadAction(Enum):
    """What a rank may ask of the launcher (NVRx's values)."""

    Continue = 0  # NVRx's names
    ExcludeThisNode = 1
    ShutdownWorkload = 2


# by name, so that NVRx's own WorkloadAction members map too
ACTIONS = {
    WorkloadAction.Continue.name: RequestAction.CONTINUE,
    WorkloadAction.ExcludeThisNode.name: RequestAction.EXCLUDE_NODE,
    WorkloadAction.ShutdownWorkload.name: RequestAction.SHUTDOWN,
}


class WorkloadControlRequest:
    def __init__(self, action: WorkloadAction, description: str = "<not set>") -> None:
        self.action = action
        self.description = description

    def __str__(self) -> str:
        return f"WorkloadControlRequest(action={self.action}, description={self.description})"
