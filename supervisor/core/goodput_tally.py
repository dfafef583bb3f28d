"""One generation as the goodput ledger tallies it from the events, and readers of event
fields that never raise (a ledger never fails on what it is fed)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# decisions of a node that only followed the job (its own ranks were healthy)
_FOLLOWING = ("peer_failed", "membership", "node_lost", "stopped")


@dataclass(slots=True)
class Tally:
    number: int
    started: float | None = None
    ended: float | None = None
    result: str | None = None
    spawned: set[int] = field(default_factory=set)
    stepping: dict[int, float] = field(default_factory=dict)  # rank -> its first step
    first_iteration: int | None = None
    last_iteration: int | None = None
    failed_at: float | None = None
    noticed_at: float | None = None
    sign: str = ""
    sign_rank: int | None = None
    decided: bool = False
    cause_rank: int = 0
    action: str | None = None
    reason: str | None = None
    rule: str | None = None
    detail: str = ""
    blamed: int | None = None
    culprit: tuple[int, int | None, str] | None = None  # the job's blame: rank, its node, rule
    restored: int | None = None  # the step the next generation restored from memory snapshots

    def mark(self, sign: str, failed_at: float, noticed_at: float, rank: int | None) -> None:
        if self.started is None or self.ended is not None:
            return  # a standby's death, or the teardown's aftermath: not the failure
        failed_at = max(failed_at, self.started)
        if self.failed_at is None or failed_at < self.failed_at:
            self.failed_at, self.sign, self.sign_rank = failed_at, sign, rank
        if self.noticed_at is None or noticed_at < self.noticed_at:
            self.noticed_at = noticed_at

    @property
    def failing(self) -> bool:
        return self.decided or self.result == "failed" or (self.ended is None and self.failed_at is not None)


def restored_from_memory(record: Mapping[str, Any]) -> tuple[int, int] | None:
    """A ``snapshot_restored`` of a held snapshot: the generation it ended the failure of
    (the one before), and the step restored; None for anything else."""
    generation, step = int_of(record, "generation"), int_of(record, "step")
    if generation is None or step is None or record.get("source") not in ("memory", "peer"):
        return None
    return generation - 1, step


def redone_since_snapshot(gen: Tally, failed: float, stepped: float) -> tuple[float, int] | None:
    """The work done again after a restore from a memory snapshot: the iterations since its
    step, and their time at the generation's own pace (its iterations over its stepping
    time: the ledger sees no single step's time); None without a restore or iterations."""
    if gen.restored is None or gen.first_iteration is None or gen.last_iteration is None:
        return None
    lost = max(0, gen.last_iteration - gen.restored)
    span = max(0.0, failed - stepped)
    steps = gen.last_iteration - gen.first_iteration + 1
    return (span if steps <= 0 else min(span, lost * span / steps)), lost


def cause_rank(decision: Mapping[str, Any]) -> int:
    """How well a decision names the root cause: a rule of the rank's own failure beats a
    rule that blames a peer, which beats no rule (a node following its peers)."""
    if decision.get("rule") is None:
        return 0
    if decision.get("category") == "peer" or decision.get("reason") in _FOLLOWING:
        return 1
    return 2


def num(record: Mapping[str, Any], key: str) -> float | None:
    v = record.get(key)
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        return None
    return float(v)


def int_of(record: Mapping[str, Any], key: str) -> int | None:
    v = record.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def str_of(record: Mapping[str, Any], key: str) -> str | None:
    v = record.get(key)
    return v if isinstance(v, str) else None
