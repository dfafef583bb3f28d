"""The restart policy: a pure function from what happened to what to do.

At this stage the policy knows the restart budget and whether a rank could not
be killed; failure classification (reschedule vs abort) refines it later.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.core.types import Action, Decision, RankFailure, Reason


@dataclass(frozen=True, slots=True)
class Budget:
    """Restarts allowed (``--max-restarts``) and restarts already used."""

    max_restarts: int
    used: int = 0

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.used < 0:
            raise ValueError("restart budget values must be >= 0")

    @property
    def remaining(self) -> int:
        return max(0, self.max_restarts - self.used)

    def spend(self) -> Budget:
        return Budget(self.max_restarts, self.used + 1)


@dataclass(frozen=True, slots=True)
class WorkloadAsk:
    """A workload request a rank sent during the generation."""

    rank: int
    action: str  # a supervisor.transport.schema.Request value
    reason: str = ""


# most severe first: abort > reschedule (exclude_node) > shutdown
_ASKS = ("abort", "reschedule", "exclude_node", "shutdown")


@dataclass(frozen=True, slots=True)
class GenerationEnd:
    """Evidence about a generation that did not simply succeed.

    ``failures`` are ordered earliest first (the root cause first); ``unkillable``
    lists the local ranks that outlived SIGKILL during the termination procedure;
    ``requests`` are what the ranks asked for.
    """

    failures: tuple[RankFailure, ...]
    unkillable: tuple[int, ...] = ()
    requests: tuple[WorkloadAsk, ...] = ()


def _strongest(requests: tuple[WorkloadAsk, ...]) -> WorkloadAsk | None:
    asks = [r for r in requests if r.action in _ASKS]
    return min(asks, key=lambda r: _ASKS.index(r.action)) if asks else None


def decide(end: GenerationEnd, budget: Budget, now: float) -> Decision:
    """Decide what follows a generation that ended without every rank succeeding
    (or with a request). ``now`` is monotonic seconds."""
    del now  # no time windows yet; kept so callers never change when they appear
    if end.unkillable:
        ranks = ", ".join(str(r) for r in end.unkillable)
        # A rank stuck in the kernel still holds its devices: a new generation
        # on this node would collide with it, so the run must not restart here.
        return Decision(
            Action.ABORT,
            Reason.RANK_UNKILLABLE,
            f"local rank(s) {ranks} survived SIGKILL (stuck in the kernel)",
        )
    ask = _strongest(end.requests)
    if ask is not None:
        said = f"rank {ask.rank} asked to {ask.action}" + (f": {ask.reason}" if ask.reason else "")
        action = {
            "abort": Action.ABORT,
            "reschedule": Action.RESCHEDULE,
            "exclude_node": Action.RESCHEDULE,
            "shutdown": Action.CONTINUE,  # the workload is done: end the run, no restart
        }[ask.action]
        return Decision(action, Reason.WORKLOAD_REQUEST, said)
    if not end.failures:
        raise ValueError("a failed generation needs at least one failure")
    root = end.failures[0]
    what = (
        f"rank {root.exit.rank} {root.summary()}"
        if root.hang
        else f"rank {root.exit.rank} failed ({root.summary()})"
    )
    reason = Reason.RANK_HUNG if root.hang is not None else Reason.RANK_FAILED
    if budget.remaining > 0:
        return Decision(Action.RESTART, reason, f"{what}; restart {budget.used + 1} of {budget.max_restarts}")
    return Decision(
        Action.ABORT,
        Reason.RESTARTS_EXHAUSTED,
        f"{what}; no restarts left (--max-restarts {budget.max_restarts})",
    )
