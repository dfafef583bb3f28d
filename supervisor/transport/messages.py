"""What a rank may tell the daemon: one frozen value per message type, as
``supervisor.transport.schema`` decodes it (``RankMessage``), and the enumerations
their fields take (``RequestAction``, ``SectionOp``).

Imported by the in-rank client: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class RequestAction(StrEnum):
    """Workload control a rank may ask for (nvidia-resiliency-ext's WorkloadAction and more)."""

    CONTINUE = "continue"
    EXCLUDE_NODE = "exclude_node"
    SHUTDOWN = "shutdown"
    RESCHEDULE = "reschedule"
    ABORT = "abort"


class SectionOp(StrEnum):
    OPEN = "open"
    CLOSE = "close"
    CLOSE_ALL = "close_all"


@dataclass(frozen=True, slots=True)
class Hello:
    rank: int
    gen: int
    pid: int
    stack_signal: int | None  # the client dumps its stacks (faulthandler) on this signal


@dataclass(frozen=True, slots=True)
class Heartbeat:
    rank: int
    gen: int


@dataclass(frozen=True, slots=True)
class Section:
    rank: int
    gen: int
    op: SectionOp
    name: str | None
    iteration: int | None
    failed: bool = False  # closed by an exception going through it: not a healthy interval


@dataclass(frozen=True, slots=True)
class Iteration:
    rank: int
    gen: int
    iteration: int


@dataclass(frozen=True, slots=True)
class Timing:
    """One step, measured inside the rank: its own work and its wait in collectives (seconds)."""

    rank: int
    gen: int
    work: float
    wait: float


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The rank loaded or saved a checkpoint: what lets timeouts be relearned."""

    rank: int
    gen: int
    event: str  # "loaded" | "saved"


@dataclass(frozen=True, slots=True)
class LoadTimeouts:
    """Learned timeouts a rank restored from its own checkpoint (load_state_dict)."""

    rank: int
    gen: int
    timeouts: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Calculate:
    """The workload asks for its timeouts to be calculated now (nvidia-resiliency-ext's
    ``calculate_and_set_*_timeouts``); the daemon answers with the timeouts in force."""

    rank: int
    gen: int
    id: str
    heartbeat: bool
    sections: tuple[str, ...] | None  # None: every monitored section (when sections_too)
    sections_too: bool
    out_of_section: bool


@dataclass(frozen=True, slots=True)
class AdviceQuery:
    """The workload asks for the checkpoint interval the daemon advises; the answer is an
    ack carrying it (``supervisor.core.checkpoint_interval.Advice``)."""

    rank: int
    gen: int
    id: str


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    rank: int
    gen: int
    action: RequestAction
    reason: str
    id: str | None = None  # when set, the daemon acknowledges: {"v": 1, "type": "ack", "id": ...}


@dataclass(frozen=True, slots=True)
class ExceptionReport:
    """An uncaught exception, sent by the client's excepthook as the rank dies."""

    rank: int
    gen: int
    exc_type: str
    message: str
    traceback: str
    causes: tuple[tuple[str, str], ...]
    pid: int | None = None  # a forked child (a data-loader worker) inherits the client


@dataclass(frozen=True, slots=True)
class Bye:
    """The rank stopped monitoring itself (shutdown_workload_monitoring)."""

    rank: int
    gen: int


@dataclass(frozen=True, slots=True)
class SaverReady:
    """The rank registered a save callback: its saver socket waits for "save now"."""

    rank: int
    gen: int
    pid: int
    id: str | None = None  # when set, the daemon acknowledges once it will ask this socket


@dataclass(frozen=True, slots=True)
class Saved:
    """The answer to a "save now" request: the callback returned (ok) or raised."""

    rank: int
    gen: int
    id: str
    ok: bool
    error: str
    seconds: float


@dataclass(frozen=True, slots=True)
class NvrxServed:
    """The rank imported ``nvidia_resiliency_ext.fault_tolerance`` and got ours in its place
    (``supervisor.client.nvrx``); ``version``: the rank's nvidia-resiliency-ext, if known."""

    rank: int
    gen: int
    version: str | None


@dataclass(frozen=True, slots=True)
class SnapshotBegin:
    """The rank is about to overwrite its snapshot ``slot`` with ``nbytes`` bytes (wire:
    ``bytes``); the answer is an ack with ``ok`` and the slot file's ``path`` (or ``why``)."""

    rank: int
    gen: int
    id: str
    slot: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class SnapshotDone:
    """The rank copied ``step`` into ``slot`` and checksummed its first ``nbytes`` bytes
    (xxh3_64, hex): fire and forget."""

    rank: int
    gen: int
    slot: int
    step: int
    nbytes: int
    checksum: str


@dataclass(frozen=True, slots=True)
class Resumed:
    """Where the rank resumed from (``client.resume``): ``source`` memory, disk or none, the
    step (None: from the beginning) and why, in words: fire and forget."""

    rank: int
    gen: int
    source: str
    step: int | None
    why: str


@dataclass(frozen=True, slots=True)
class SnapshotRestore:
    """The rank asks which of its slots holds the newest step every rank holds complete."""

    rank: int
    gen: int
    id: str


RankMessage = (
    Hello
    | Heartbeat
    | Section
    | Iteration
    | Timing
    | Checkpoint
    | LoadTimeouts
    | Calculate
    | AdviceQuery
    | WorkloadRequest
    | ExceptionReport
    | Bye
    | SaverReady
    | Saved
    | NvrxServed
    | SnapshotBegin
    | SnapshotDone
    | SnapshotRestore
    | Resumed
)
