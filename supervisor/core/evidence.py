"""What is known about a generation that did not simply succeed: one immutable value.

The runtime gathers it (exits, error files, reported exceptions, log tails and
lines noticed while the ranks ran, hangs, stacks, requests, the kernel log);
classifiers read it; the policy decides from what they made of it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from supervisor.core.types import RankFailure


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    """A workload request a rank sent during the generation."""

    rank: int
    action: str  # a supervisor.transport.schema.RequestAction value
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Evidence:
    """A generation that did not simply succeed.

    ``failures`` are ordered earliest first (the root cause first); ``unkillable``
    lists the local ranks that outlived SIGKILL during the termination procedure;
    ``requests`` are what the ranks asked for; ``dmesg`` and ``agent_log`` are
    node-level lines (the kernel's, a launcher's) when they could be read.
    """

    failures: tuple[RankFailure, ...]
    unkillable: tuple[int, ...] = ()
    # ranks we stopped that did not end cleanly (by our signal or a code of their own):
    # when every failure blames a peer (a reset connection), the peer may be one of
    # them, caught on its way out with its own error already printed
    stopped: tuple[RankFailure, ...] = ()
    requests: tuple[WorkloadRequest, ...] = ()
    generation: int = 0
    node: str = ""
    dmesg: tuple[str, ...] = ()
    agent_log: tuple[str, ...] = ()
    # iterations this generation advanced past the best seen before it (None: no
    # rank reported iterations), and whether it saved a checkpoint: what tells
    # progress from a crash loop
    progress: int | None = None
    saved: bool = False


class Part(StrEnum):
    """What an ended rank was in its generation's failure."""

    FAILED = "failed"  # it failed on its own (or hung): a candidate for the root cause
    STOPPED = "stopped"  # we stopped it and it did not end cleanly (Evidence.stopped)
    BYSTANDER = "bystander"  # we stopped it and it exited 0: nothing to say


def part_of(
    state: str,
    *,
    exit_code: int | None,
    error_at: float | None,
    stop_wall: float | None,
    hung: bool,
    reported_first: bool = False,
) -> Part | None:
    """A rank's part, from its final state (None unless it failed or was stopped).

    A rank we stopped may have raised first and been slow to exit while a peer failed
    because of it (its ``finally`` closed the process group: the peer read a reset
    connection): its error file written, or its exception reported by its client,
    before we stopped it gives it away. The daemon and ``ft-supervisor classify`` both
    judge by this rule.
    """
    if state not in ("failed", "stopped"):
        return None
    failed_first = reported_first or (error_at is not None and (stop_wall is None or error_at < stop_wall))
    if state == "failed" or failed_first or hung:
        return Part.FAILED
    return Part.BYSTANDER if exit_code == 0 else Part.STOPPED


def root_first(evidence: Evidence, rank: int | None) -> Evidence:
    """``evidence`` with ``rank``'s failure first, the root cause the classification
    named: a rank's own failure before the reset a peer read because of it, whichever
    came first in time. A stopped rank named (the peer a reset blames, caught on its
    way out) joins ``failures``; a rank with no failure here leaves them as they are."""
    named = [f for f in (*evidence.failures, *evidence.stopped) if f.exit.rank == rank][:1]
    if not named or (evidence.failures and evidence.failures[0] is named[0]):
        return evidence
    root = named[0]
    return replace(
        evidence,
        failures=(root, *(f for f in evidence.failures if f is not root)),
        stopped=tuple(f for f in evidence.stopped if f is not root),
    )
