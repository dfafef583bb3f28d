"""How long a failure kept the ranks from training, read from the event stream.

Recovery time is measured from the moment the daemon noticed a generation's
first failure (a rank that exited failed or reported its failure, a hang, a
peer node's news, an operator's restart, a workload request) to the moment every
rank of the *next* generation completed its first step (``rank_stepping``). So
it covers ending the failed generation, deciding, any rendezvous, releasing or
spawning the next ranks and their first step: the time a restart costs, the
interval ``supervisor.core.goodput`` calls *restart*, taken here on the
monotonic clock and as soon as it completes (a histogram observes it then).

A measurement needs ranks that report steps (``supervisor.client``); without
them none is made. A next generation that fails before all its ranks step
yields none either: its own failure starts a new measurement (the time lost
in between is what goodput accounts for).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.catalogue.generation import GenerationStarted, RestartRequested
from supervisor.core.catalogue.job import NodeMoved, PeerNews
from supervisor.core.catalogue.ranks import (
    RankExited,
    RankFailureReported,
    RankHung,
    RankSpawned,
    RankStepping,
    WorkloadRequest,
)

# events that say the daemon knows the running generation is over (the signs goodput uses)
FAILURES = frozenset(
    {
        RankExited.NAME,
        RankHung.NAME,
        RankFailureReported.NAME,
        PeerNews.NAME,
        RestartRequested.NAME,
        WorkloadRequest.NAME,
    }
)


def is_failure(name: str, record: Mapping[str, Any]) -> bool:
    if name not in FAILURES:
        return False
    if name == RankExited.NAME:
        # a standby dropped unused, or a rank stopped by us, is no failure
        return record.get("state") == "failed" and not record.get("standby")
    if name == WorkloadRequest.NAME:
        return record.get("action") not in (None, "continue")
    return True


@dataclass(slots=True)
class Recovery:
    """Feed it every event (``add``); it returns a recovery time when one completes."""

    current: int | None = None  # the generation running now
    failed: tuple[int, float] | None = None  # (generation, t_mono of the first failure noticed)
    ranks: dict[int, set[int]] = field(default_factory=dict)  # generation -> its ranks
    stepping: set[int] = field(default_factory=set)  # ranks of failed + 1 that stepped

    def add(self, name: str, record: Mapping[str, Any]) -> float | None:
        generation = record.get("generation")
        if not isinstance(generation, int):
            return None
        if name == RankSpawned.NAME:
            self.ranks.setdefault(generation, set()).add(int(record["rank"]))
        elif name == NodeMoved.NAME:
            self.ranks.pop(generation, None)  # respawned for the node's new place, new ranks
        elif name == GenerationStarted.NAME:
            self.current = generation
            # prepared generations that never started are forgotten
            self.ranks = {g: r for g, r in self.ranks.items() if g >= generation}
        elif is_failure(name, record) and generation == self.current:
            if self.failed is None or self.failed[0] != generation:
                self.failed = (generation, float(record["t_mono"]))
                self.stepping = set()
        elif name == RankStepping.NAME:
            return self._stepped(generation, int(record["rank"]), float(record["t_mono"]))
        return None

    def _stepped(self, generation: int, rank: int, now: float) -> float | None:
        if self.failed is None or generation != self.failed[0] + 1:
            return None
        self.stepping.add(rank)
        if not self.stepping >= self.ranks.get(generation, set()):
            return None
        seconds = now - self.failed[1]
        self.failed = None
        return max(seconds, 0.0)
