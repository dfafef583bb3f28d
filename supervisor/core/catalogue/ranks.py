"""Events of one rank: it starts, talks, steps, hangs, fails and exits."""

from __future__ import annotations

from typing import Any

from supervisor.core.catalogue.base import DEBUG, ERROR, WARNING, Event


class RankSpawned(Event, name="rank_spawned", level=DEBUG):
    """A rank's process was started (or taken from the standbys)."""

    generation: int
    rank: int
    local_rank: int
    pid: int
    standby: bool
    forked: bool


class RankConnected(Event, name="rank_connected", level=DEBUG):
    """A rank's client connected to the daemon's monitor socket."""

    generation: int | None
    rank: int
    pid: int | None
    stack_dumps: bool


class RankExited(Event, name="rank_exited", level=WARNING):
    """A rank's process ended: its exit code or signal (WARNING when it failed)."""

    generation: int
    rank: int
    local_rank: int
    pid: int
    exit_code: int | None
    signal: str | None
    state: str
    standby: bool | None
    stdout_bytes: int | None
    stderr_bytes: int | None


class RankExitSlow(Event, name="rank_exit_slow"):
    """A rank takes long to exit after it was told to stop."""

    generation: int
    rank: int
    pid: int
    detail: str


class RankExitStuck(Event, name="rank_exit_stuck", level=WARNING):
    """A rank did not exit: after reporting a failure, or after its peers succeeded."""

    generation: int
    after: str  # failure_reported | peers_succeeded
    native_error: str | None = None
    rank: int
    pid: int
    waited: float
    # with after=peers_succeeded only: where it is stuck, and whether its work was done
    where: list[str] | None = None
    teardown: bool | None = None
    finished: str | None = None  # why its own reports say it finished its work
    success: bool | None = None
    why: str | None = None
    iteration: int | None = None
    peers_iteration: int | None = None


class RankFailureReported(Event, name="rank_failure_reported"):
    """A rank reported its failure and is given the exit grace to exit by itself."""

    generation: int
    rank: int
    pid: int
    exit_grace: float
    how: str


class RankUnkillable(Event, name="rank_unkillable", level=ERROR):
    """Ranks survived SIGKILL past the kill timeout (stuck in the kernel: D state)."""

    generation: int
    local_ranks: list[int]
    pids: list[int]
    kill_timeout: float


class DeadlineMissed(Event, name="deadline_missed", level=WARNING):
    """A rank's heartbeat or section deadline passed: a hang is suspected."""

    generation: int
    rank: int
    kind: str
    section: str | None
    open_for: float
    timeout: float | None
    late_by: float


class DeadlineIgnored(Event, name="deadline_ignored"):
    """A missed deadline not treated as a hang (a rank of the generation already failed)."""

    why: str
    generation: int
    rank: int
    kind: str
    section: str | None
    open_for: float
    timeout: float | None
    late_by: float


class RankHung(Event, name="rank_hung", level=WARNING):
    """A rank is named hung, with the evidence that decided and whose deadline was missed."""

    generation: int
    rank: int
    kind: str
    section: str | None
    open_for: float
    timeout: float | None
    late_by: float
    deadline_rank: int
    blamed_by: str
    undetermined: bool | None
    waiting: list[int] | None
    evidence: str


class RankStepping(Event, name="rank_stepping", level=DEBUG):
    """A rank completed its first training step of the generation."""

    generation: int | None
    rank: int
    iteration: int | None


class ChildException(Event, name="child_exception", level=DEBUG):
    """A rank's process reported an uncaught exception before it exits."""

    generation: int | None
    rank: int
    pid: int | None
    exc_type: str
    message: str


class ExceptionReported(Event, name="exception_reported", level=DEBUG):
    """A rank reported an exception through the client."""

    generation: int | None
    rank: int
    exc_type: str
    message: str


class StacksDumped(Event, name="stacks_dumped", quiet=("stacks",)):
    """A rank's Python stacks were dumped (to its log; the text is in the event)."""

    generation: int
    rank: int
    where: str
    lines: int
    log: str
    stacks: str


class HeartbeatsUnmonitored(Event, name="heartbeats_unmonitored", level=WARNING):
    """A rank sends heartbeats but no heartbeat timeout is in force."""

    generation: int | None
    rank: int
    detail: str


class NvrxServed(Event, name="nvrx_served"):
    """A rank uses nvidia-resiliency-ext's client, served by this daemon."""

    generation: int | None
    rank: int
    version: str | None
    detail: str


class WorkloadRequest(Event, name="workload_request", level=WARNING):
    """A rank asked for an action (restart, reschedule, abort)."""

    generation: int | None
    rank: int
    action: str
    reason: str


class MessageFailed(Event, name="message_failed", level=ERROR):
    """Handling a rank's message raised (a bug): the message was skipped."""

    message: str
    rank: int | None
    error: str
    traceback: str


class MessageDropped(Event, name="message_dropped", level=WARNING):
    """A message from a rank was dropped (malformed, wrong version, unknown sender)."""

    reason: str
    detail: str


class TimeoutsCalculated(Event, name="timeouts_calculated"):
    """A rank's timeouts were learned from its own steps and sections."""

    generation: int | None
    rank: int
    learned: dict[str, Any]
    in_force: dict[str, Any]


class TimeoutsRestored(Event, name="timeouts_restored"):
    """Timeouts learned in an earlier run were restored for a rank."""

    rank: int
    timeouts: dict[str, Any]


class StragglerScoring(Event, name="straggler_scoring", level=DEBUG):
    """The straggler detector's measurements of a generation's ranks."""

    generation: int | None
    ranks: list[int]
    measured: list[int]  # ranks whose clients measure their steps (waits taken out)
    reference: float


class StragglerDetected(Event, name="straggler_detected", level=WARNING):
    """A rank is persistently slower than its peers."""

    generation: int | None
    rank: int
    node: str
    score: float
    window: int
    work: float
    reference: float
    sustained: float
    against: str
    action: str


class StragglerCleared(Event, name="straggler_cleared"):
    """A rank flagged as a straggler keeps pace again."""

    generation: int | None
    rank: int
    node: str
    score: float
    window: int
    work: float
    reference: float
    sustained: float
    against: str
    action: str
