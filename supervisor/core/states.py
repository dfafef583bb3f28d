"""Rank states and the only transitions allowed between them.

A rank is born either STANDBY (spawned ahead of its generation, waiting for the
go) or RUNNING. It ends SUCCEEDED or FAILED by itself, or STOPPED once the
termination procedure has ended it; UNKILLABLE is a rank that outlived SIGKILL.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class RankState(StrEnum):
    STANDBY = "standby"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"
    UNKILLABLE = "unkillable"


S = RankState
ALLOWED: Mapping[RankState, frozenset[RankState]] = {
    # STANDBY -> RUNNING when its generation starts; -> FAILED if it dies while waiting
    S.STANDBY: frozenset({S.RUNNING, S.STOPPING, S.FAILED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.STOPPING}),
    # a rank may still exit on its own (0 or not) after we signalled it: that is STOPPED
    S.STOPPING: frozenset({S.STOPPED, S.UNKILLABLE}),
    # the kernel may let an unkillable rank go eventually
    S.UNKILLABLE: frozenset({S.STOPPED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.STOPPED: frozenset(),
}
del S

ALIVE: frozenset[RankState] = frozenset(
    {RankState.STANDBY, RankState.RUNNING, RankState.STOPPING, RankState.UNKILLABLE}
)


class IllegalTransition(RuntimeError):
    def __init__(self, old: RankState, new: RankState) -> None:
        super().__init__(f"rank state {old} -> {new} is not allowed")
        self.old = old
        self.new = new


def advance(old: RankState, new: RankState) -> RankState:
    """Return ``new`` if ``old -> new`` is an allowed edge; raise otherwise."""
    if new not in ALLOWED[old]:
        raise IllegalTransition(old, new)
    return new


class GroupResult(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


# still doing something of its own accord (an UNKILLABLE rank is not: it was ended)
_ACTIVE = frozenset({RankState.STANDBY, RankState.RUNNING, RankState.STOPPING})


def group_result(states: Mapping[int, RankState]) -> GroupResult:
    """One failed rank fails the group; the group succeeds when every rank did;
    a group ended by the supervisor with neither is stopped."""
    values = states.values()
    if any(s is RankState.FAILED for s in values):
        return GroupResult.FAILED
    if values and all(s is RankState.SUCCEEDED for s in values):
        return GroupResult.SUCCEEDED
    if values and not any(s in _ACTIVE for s in values):
        return GroupResult.STOPPED
    return GroupResult.RUNNING
