"""The policy: a pure function from what happened to what to do.

``decide(evidence, classification, history, budget, now)`` returns a Decision.
In order, first match wins:

1. a rank outlived SIGKILL (stuck in the kernel, it still holds its devices):
   reschedule, the node cannot host a new generation;
2. a workload request is honoured (abort > reschedule / exclude_node > shutdown),
   except that a failure classified abort stays abort;
3. a classification whose action is abort aborts: abort never downgrades;
4. a rule's ``repeat`` action applies once the rule has matched ``after`` times
   before on this node *without progress since* ("restart once, then abort"), and
   a hardware-looking failure seen again that way reschedules (escalation). A
   failure after real progress (new iterations past the best, or a checkpoint
   saved) is a new incident, not a repeat. When the ranks report no progress at
   all the daemon cannot tell a repeat from a new incident: a repeat may then
   escalate to reschedule, never to abort (the budget bounds the restarts, as
   with torchrun);
5. a crash loop aborts: ``max_no_progress`` generations in a row failed without
   advancing the iteration by ``min_progress`` or saving a checkpoint (as
   nvidia-resiliency-ext's progress tracker; only when ranks report iterations);
6. a reschedule classification reschedules;
7. otherwise restart while the budget allows (``max_restarts``, optionally per
   ``window`` seconds); when it is spent, reschedule if the failures were
   transient or hardware, abort if deterministic.

A policy preset (``on_failure``) can turn every restart into a reschedule or an
abort (MindCluster's ``recover`` and ``exit`` strategies).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from supervisor.core.classify import Classification
from supervisor.core.evidence import Evidence, WorkloadRequest
from supervisor.core.types import SEVERITY, Action, Decision, Reason

# kept here too for callers that imported it from the policy
__all__ = ["Budget", "History", "Past", "Policy", "WorkloadRequest", "decide"]


@dataclass(frozen=True, slots=True)
class Budget:
    """Restarts allowed and used: ``max_restarts`` in the run, or within any
    ``window`` seconds when a window is set. Times are monotonic seconds."""

    max_restarts: int
    window: float | None = None
    restarts_at: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")
        if self.window is not None and self.window <= 0:
            raise ValueError("the restart window must be > 0 seconds")

    @property
    def used(self) -> int:
        return len(self.restarts_at)

    def remaining(self, now: float) -> int:
        counted = self.restarts_at
        if self.window is not None:
            counted = tuple(t for t in counted if now - t < self.window)
        return max(0, self.max_restarts - len(counted))

    def spend(self, now: float) -> Budget:
        return Budget(self.max_restarts, self.window, (*self.restarts_at, now))


@dataclass(frozen=True, slots=True)
class Past:
    """One earlier failed generation on this node, as the policy remembers it."""

    at: float
    rule: str
    nature: str
    signature: str
    progress: int | None = None
    saved: bool = False

    @classmethod
    def of(cls, evidence: Evidence, classification: Classification, at: float) -> Past:
        c = classification
        return cls(at, c.rule, c.nature, c.signature, evidence.progress, evidence.saved)


@dataclass(frozen=True, slots=True)
class History:
    failures: tuple[Past, ...] = ()

    def add(self, past: Past) -> History:
        return History((*self.failures, past))

    def count(self, rule: str) -> int:
        return sum(1 for p in self.failures if p.rule == rule)

    def repeats(self, current: Past, min_progress: int) -> int:
        """Earlier failures of ``current.rule`` with no progress between them and now: the
        ones it repeats. None at all when ``current``'s own generation made progress."""
        if progressed(current, min_progress):
            return 0
        count = 0
        for p in reversed(self.failures):
            count += p.rule == current.rule
            if progressed(p, min_progress):
                break  # the failure that ended a generation with progress began the streak
        return count


def progressed(p: Past, min_progress: int) -> bool | None:
    """Did that generation make progress? None: its ranks never said."""
    if p.saved:
        return True
    return None if p.progress is None else p.progress >= min_progress


@dataclass(frozen=True, slots=True)
class Policy:
    max_no_progress: int = 3  # nvidia-resiliency-ext's max_no_progress_cycles; <= 0 disables
    min_progress: int = 1  # ...and min_progress_iterations
    on_failure: Action = Action.RESTART  # what a restartable failure gets (a preset may change it)
    on_exhausted: Action | None = None  # None: by the failure's nature

    def to_json(self) -> dict[str, Any]:
        return {
            "max_no_progress": self.max_no_progress,
            "min_progress": self.min_progress,
            "on_failure": str(self.on_failure),
            "on_exhausted": None if self.on_exhausted is None else str(self.on_exhausted),
        }

    @classmethod
    def from_json(cls, data: object) -> Policy | None:
        """None when ``data`` is not a policy this version wrote (an older run's log)."""
        if not isinstance(data, dict):
            return None
        try:
            exhausted = data.get("on_exhausted")
            return cls(
                max_no_progress=int(data["max_no_progress"]),
                min_progress=int(data["min_progress"]),
                on_failure=Action(data["on_failure"]),
                on_exhausted=None if exhausted is None else Action(exhausted),
            )
        except (KeyError, TypeError, ValueError):
            return None


_ASKS = {
    "abort": Action.ABORT,
    "reschedule": Action.RESCHEDULE,
    "exclude_node": Action.RESCHEDULE,
    "shutdown": Action.CONTINUE,  # the workload is done: end the run, no restart
}
_ASK_ORDER = ("abort", "reschedule", "exclude_node", "shutdown")


def _strongest(requests: tuple[WorkloadRequest, ...]) -> WorkloadRequest | None:
    asks = [r for r in requests if r.action in _ASK_ORDER]
    return min(asks, key=lambda r: _ASK_ORDER.index(r.action)) if asks else None


def _no_progress_streak(history: History, current: Past, policy: Policy) -> int:
    streak = 0
    for p in (current, *reversed(history.failures)):
        if p.progress is None or p.saved or p.progress >= policy.min_progress:
            break
        streak += 1
    return streak


def _what(c: Classification) -> str:
    """``rank 1: RuntimeError: bad batch [P9]``: who, what it left, which rule."""
    who = f"rank {c.rank}: " if c.rank is not None else ""
    said = c.lines[0] if c.lines else c.summary
    return f"{who}{said[:300]} [{c.rule}]"


@dataclass(frozen=True, slots=True)
class _Case:
    """Everything one decision looks at."""

    evidence: Evidence
    c: Classification
    history: History
    budget: Budget
    now: float
    policy: Policy

    @property
    def current(self) -> Past:
        return Past.of(self.evidence, self.c, self.now)

    @property
    def seen(self) -> int:
        """How many times before this failure repeats (see ``History.repeats``)."""
        return self.history.repeats(self.current, self.policy.min_progress)


def _unkillable(k: _Case) -> Decision | None:
    if not k.evidence.unkillable:
        return None
    ranks = ", ".join(str(r) for r in k.evidence.unkillable)
    return Decision(
        Action.RESCHEDULE,
        Reason.RANK_UNKILLABLE,
        f"local rank(s) {ranks} survived SIGKILL (stuck in the kernel): "
        "this node cannot host a new generation",
    )


def _request(k: _Case) -> Decision | None:
    ask = _strongest(k.evidence.requests)
    if ask is None or (k.evidence.failures and k.c.action is Action.ABORT):
        return None
    said = f"rank {ask.rank} asked to {ask.action}" + (f": {ask.reason}" if ask.reason else "")
    return Decision(_ASKS[ask.action], Reason.WORKLOAD_REQUEST, said)


def _not_retryable(k: _Case) -> Decision | None:
    if k.c.action is not Action.ABORT:
        return None
    # the rule's summary says what to do instead (a setup error names the fix)
    why = f": {k.c.summary}" if k.c.summary else ""
    return Decision(Action.ABORT, Reason.NOT_RETRYABLE, f"{_what(k.c)}: retrying cannot help{why}")


def _repeated(k: _Case) -> Decision | None:
    c, seen = k.c, k.seen
    repeat = c.repeat
    if repeat is Action.ABORT and progressed(k.current, k.policy.min_progress) is None:
        repeat = None  # no progress reported: a repeat cannot be told from a new incident
    if repeat is not None and seen >= c.after and SEVERITY[repeat] > SEVERITY[c.action]:
        if repeat is Action.RESTART and k.budget.remaining(k.now) <= 0:
            return _budgeted(k)  # an escalation to restart still spends the budget
        return Decision(
            repeat, Reason.REPEATED, f"{_what(c)}, seen {seen} time(s) before on this node without progress"
        )
    if c.nature == "hardware" and seen >= 1:
        return Decision(
            Action.RESCHEDULE, Reason.REPEATED, f"{_what(c)}: the same hardware fault again on this node"
        )
    return None


def _crash_loop(k: _Case) -> Decision | None:
    streak = _no_progress_streak(k.history, k.current, k.policy)
    if 0 < k.policy.max_no_progress <= streak:
        return Decision(
            Action.ABORT, Reason.NO_PROGRESS,
            f"{_what(k.c)}; {streak} generation(s) in a row failed with no progress "
            f"(< {k.policy.min_progress} iteration(s), no checkpoint saved)",
        )  # fmt: skip
    return None


def _elsewhere(k: _Case) -> Decision | None:
    if k.c.action is not Action.RESCHEDULE:
        return None
    return Decision(Action.RESCHEDULE, Reason.CLASSIFIED, f"{_what(k.c)}: run it elsewhere")


def _budgeted(k: _Case) -> Decision:
    c, budget = k.c, k.budget
    reason = Reason.RANK_HUNG if c.category == "hang" else Reason.RANK_FAILED
    if k.policy.on_failure is not Action.RESTART:
        return Decision(k.policy.on_failure, reason, f"{_what(c)}; the policy does not restart in place")
    left = budget.remaining(k.now)
    if left > 0:
        return Decision(
            Action.RESTART, reason, f"{_what(c)}; restart {budget.used + 1} ({left - 1} left after it)"
        )
    exhausted = k.policy.on_exhausted or (Action.ABORT if c.nature == "deterministic" else Action.RESCHEDULE)
    window = f" per {budget.window:g} s" if budget.window else ""
    return Decision(
        exhausted,
        Reason.RESTARTS_EXHAUSTED,
        f"{_what(c)}; no restarts left (--max-restarts {budget.max_restarts}{window}), "
        f"the failure is {c.nature}",
    )


# the checks, in order: the first that has something to say decides
_CHECKS = (_unkillable, _request, _not_retryable, _repeated, _crash_loop, _elsewhere)
_DEFAULT = Policy()


def decide(
    evidence: Evidence,
    classification: Classification,
    history: History,
    budget: Budget,
    now: float,
    *,
    policy: Policy = _DEFAULT,
) -> Decision:
    """Decide what follows a generation that did not simply succeed. ``now`` is monotonic."""
    case = _Case(evidence, classification, history, budget, now, policy)
    for check in _CHECKS:
        decision = check(case)
        if decision is not None:
            return decision
    return _budgeted(case)
