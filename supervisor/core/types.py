"""The vocabulary of ft-supervisor as immutable values.

rank: one training process. rank group: the ranks of this node. generation: one
(re)start round of the rank group. evidence: what is known about a failure.
decision: what the policy concluded (an action and a reason).
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from supervisor.core.watch import Hang

if TYPE_CHECKING:  # the ranks import these types: the catalogue's import is theirs to skip
    from supervisor.core.catalogue import Event


class Action(StrEnum):
    """What the job needs next. Ordered by severity (see SEVERITY)."""

    CONTINUE = "continue"
    RESTART = "restart"
    RESCHEDULE = "reschedule"
    ABORT = "abort"


SEVERITY: dict[Action, int] = {
    Action.CONTINUE: 0,
    Action.RESTART: 1,
    Action.RESCHEDULE: 2,
    Action.ABORT: 3,
}


class Reason(StrEnum):
    """Machine-readable reason attached to every decision."""

    RANK_FAILED = "rank_failed"
    RANK_HUNG = "rank_hung"
    RESTARTS_EXHAUSTED = "restarts_exhausted"
    RANK_UNKILLABLE = "rank_unkillable"
    WORKLOAD_REQUEST = "workload_request"
    OPERATOR_REQUEST = "operator_request"
    NOT_RETRYABLE = "not_retryable"  # the classification says retrying cannot help
    CLASSIFIED = "classified"  # the classification asks for another node
    REPEATED = "repeated"  # the same failure again on this node: escalated
    NO_PROGRESS = "no_progress"  # a crash loop
    # multi-node: why a node whose own ranks were healthy restarts or leaves
    PEER_FAILED = "peer_failed"  # another node's generation failed
    MEMBERSHIP = "membership"  # a node joined or left: the world changes
    NODE_LOST = "node_lost"  # another node's daemon stopped keeping the rendezvous alive
    STOPPED = "stopped"  # this node was told to stop (a signal): it leaves the job
    RENDEZVOUS_TIMEOUT = "rendezvous_timeout"  # too few nodes came back within the join timeout
    RENDEZVOUS_LOST = "rendezvous_lost"  # the rendezvous store cannot be reached
    SPAWN_FAILED = "spawn_failed"  # this node could not start a generation's ranks (a full disk...)
    LAYOUT = "layout"  # the nodes of a job run different numbers of ranks (--nproc-per-node)
    NODE_QUARANTINED = "node_quarantined"  # too many hardware-looking failures here (--node-quarantine)
    STRAGGLER = "straggler"  # a rank of this node kept working slower than its peers (--straggler-action)


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: Reason
    detail: str = ""


def signal_name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a process ended: an exit code, or the signal that killed it."""

    code: int | None = None
    signal: int | None = None

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        # subprocess convention: a negative return code is the killing signal
        if returncode < 0:
            return cls(signal=-returncode)
        return cls(code=returncode)

    @property
    def succeeded(self) -> bool:
        return self.code == 0

    def describe(self) -> str:
        if self.signal is not None:
            return f"signal {self.signal} ({signal_name(self.signal)})"
        if self.code is None:
            return "an unknown exit"
        return f"exit code {self.code}"


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    """The torchelastic error file a rank wrote through ``@record``."""

    message: str
    traceback: str = ""
    timestamp: int | None = None  # wall-clock seconds, as torchelastic writes it
    error_code: int | None = None


@dataclass(frozen=True, slots=True)
class RankExit:
    """A rank process ended. ``at`` is monotonic, ``at_wall`` is wall-clock time."""

    local_rank: int
    rank: int
    pid: int
    status: ExitStatus
    at: float
    at_wall: float
    # True when the supervisor's termination procedure had already signalled it:
    # such an exit is a consequence of a decision, never a failure.
    terminated: bool = False


@dataclass(frozen=True, slots=True)
class ReportedException:
    """An uncaught exception the rank's client reported before the rank died.

    ``type`` is the qualified name (``torch.distributed.DistBackendError``);
    ``causes`` is the chain below it (``__cause__`` or ``__context__``), outermost
    first, as (qualified type, message) pairs.
    """

    type: str
    message: str
    traceback: str = ""
    causes: tuple[tuple[str, str], ...] = ()

    def lines(self) -> tuple[str, ...]:
        """The exception as the text lines a traceback would show."""
        out = [*self.traceback.splitlines(), f"{self.type}: {self.message}"]
        out += [f"{kind}: {message}" for kind, message in self.causes]
        return tuple(out)


@dataclass(frozen=True, slots=True)
class RankFailure:
    """Evidence about one failed rank."""

    exit: RankExit
    error: ErrorRecord | None = None
    # wall-clock time the error file was written (its mtime): when the rank
    # failed, to the nanosecond, even if it took a while to exit afterwards
    error_at: float | None = None
    log_tail: tuple[str, ...] = ()  # the last lines of the rank's stderr
    hang: Hang | None = None  # it was declared hung...
    hang_at: float | None = None  # ...past this deadline (wall clock)
    stacks: str = ""  # its threads' Python stacks, dumped before it was killed
    exception: ReportedException | None = None  # what its client reported
    # log lines that looked like trouble, seen while the rank ran: they may have
    # scrolled out of the tail by the time it exited
    notable: tuple[str, ...] = ()
    # completed a step this generation? None when the rank never said (no client)
    progressed: bool | None = None
    # what reached its log after it died: processes it left behind (forked workers)
    # speak there, of their own trouble, which says nothing of why the rank died
    after_exit: tuple[str, ...] = ()

    def texts(self) -> tuple[str, ...]:
        """Every line of text this rank left: error file, reported exception, logs."""
        out: list[str] = []
        if self.error is not None:
            out += [*self.error.traceback.splitlines(), *self.error.message.splitlines()]
        if self.exception is not None:
            out += self.exception.lines()
        return (*out, *self.notable, *self.log_tail)

    @property
    def failed_at(self) -> float:
        """Best estimate of when the rank failed (wall clock)."""
        return min(t for t in (self.exit.at_wall, self.error_at, self.hang_at) if t is not None)

    def summary(self) -> str:
        if self.hang is not None:
            return f"hung: {self.hang.describe()}"
        if self.error is not None:
            return self.error.message
        return self.exit.status.describe()


class EventSink(Protocol):
    """Where an adapter reports what it did: the daemon's event log, as a seam
    (the adapters never import the runtime)."""

    def emit(self, event: Event, level: int | None = ...) -> None: ...
