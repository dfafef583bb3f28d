"""A node's health across runs: the hardware-looking failures it has seen, and
when they are too many for it to be trusted with ranks.

MindCluster escalates after the same fault three times in a day; ByteRobust evicts
suspect machines. A daemon forgets everything when it exits, so the ledger lives in
a small file under a state directory that outlives runs (runtime.records.health).
Here are the rules, as pure functions of the ledger and the time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.core.types import Action, Decision, Reason

KEEP = 256  # marks a ledger keeps: the newest
KEEP_FOR = 30 * 86400.0  # seconds a mark is kept, whatever the window asked for
DETAIL_MAX = 300  # characters of a mark's detail


@dataclass(frozen=True, slots=True)
class Mark:
    """One hardware-looking failure on this node."""

    at: float  # wall-clock seconds
    kind: str  # hardware (a classification's nature) | unkillable
    rule: str  # the rule that classified it ("" for an unkillable rank)
    detail: str
    run_id: str = ""
    generation: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "kind": self.kind, "rule": self.rule, "detail": self.detail,
                "run_id": self.run_id, "generation": self.generation}  # fmt: skip

    @classmethod
    def from_json(cls, raw: object) -> Mark | None:
        """A mark from the file, or None for anything that is not one (a hand-edited
        or half-written file must not stop a node from starting)."""
        if not isinstance(raw, Mapping):
            return None
        at, kind, rule, detail = raw.get("at"), raw.get("kind"), raw.get("rule"), raw.get("detail")
        generation = raw.get("generation")
        if not isinstance(at, int | float) or isinstance(at, bool) or not math.isfinite(at):
            return None
        if not all(isinstance(s, str) for s in (kind, rule, detail)):
            return None
        run_id = raw.get("run_id")
        if not isinstance(generation, int) or isinstance(generation, bool):
            generation = None
        return cls(
            float(at), str(kind)[:32], str(rule)[:64], str(detail)[:DETAIL_MAX],
            run_id=run_id[:128] if isinstance(run_id, str) else "", generation=generation,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Quarantine:
    """``COUNT/WINDOW``: this many marks within this many seconds keep the node's ranks off."""

    count: int
    window: float  # supervisor.config.health parses it, in the options' one duration syntax

    def __str__(self) -> str:
        return f"{self.count}/{_duration(self.window)}"


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True, slots=True)
class Ledger:
    marks: tuple[Mark, ...] = ()

    def add(self, mark: Mark) -> Ledger:
        return Ledger(pruned((*self.marks, mark), mark.at))

    def within(self, now: float, window: float) -> tuple[Mark, ...]:
        return tuple(m for m in self.marks if now - window <= m.at <= now + 60.0)

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "marks": [m.to_json() for m in self.marks]}

    @classmethod
    def from_json(cls, raw: object, now: float) -> Ledger:
        marks = raw.get("marks") if isinstance(raw, Mapping) else None
        if not isinstance(marks, list):
            return cls()
        read = (Mark.from_json(m) for m in marks[: KEEP * 4])
        return cls(pruned((m for m in read if m is not None), now))


def pruned(marks: Iterable[Mark], now: float) -> tuple[Mark, ...]:
    """The newest KEEP marks of the last KEEP_FOR seconds, oldest first."""
    recent = sorted((m for m in marks if m.at >= now - KEEP_FOR), key=lambda m: m.at)
    return tuple(recent[-KEEP:])


def mark_of(
    decision: Decision, nature: str | None, rule: str | None, *, now: float, run_id: str, generation: int,
    culprit: bool = False,
) -> Mark | None:  # fmt: skip
    """The mark a decision leaves on the node: a hardware classification, or a rank
    that outlived SIGKILL (stuck in the kernel: a driver or device in trouble), or a
    straggler sent away (a node that keeps being slow is quarantined as a faulty one),
    or a rank the job's blame named as the one a job-wide hang waited for (``culprit``:
    the nodes whose ranks only waited are not marked)."""
    if decision.reason is Reason.RANK_UNKILLABLE:
        kind = "unkillable"
    elif decision.reason is Reason.STRAGGLER and decision.action is Action.RESCHEDULE:
        kind = "straggler"
    elif nature == "hardware":
        kind = "hardware"
    elif culprit and decision.reason is Reason.RANK_HUNG:
        kind = "hang"
    else:
        return None
    detail = decision.detail[:DETAIL_MAX]
    return Mark(now, kind, rule or "", detail, run_id=run_id, generation=generation)


def quarantined(ledger: Ledger, rule: Quarantine | None, now: float) -> Decision | None:
    """The node's ranks stay off when its ledger holds ``rule.count`` marks within the
    window: the node asks to be replaced (the reschedule code), saying why."""
    if rule is None:
        return None
    recent = ledger.within(now, rule.window)
    if len(recent) < rule.count:
        return None
    kinds = ", ".join(sorted({m.rule or m.kind for m in recent}))
    return Decision(
        Action.RESCHEDULE,
        Reason.NODE_QUARANTINED,
        f"this node saw {len(recent)} hardware-looking failure(s) within {_duration(rule.window)} "
        f"({kinds}; --node-quarantine {rule}): it starts no ranks; `ft-supervisor node --clear` "
        "once it is repaired",
    )


def screen(decision: Decision, ledger: Ledger, rule: Quarantine | None, now: float) -> Decision:
    """Before a restart: a node that has just crossed its threshold leaves instead."""
    if decision.action is not Action.RESTART:
        return decision
    return quarantined(ledger, rule, now) or decision
