"""What the goodput ledger (``goodput.Ledger``) reports: a run's figures, and each
incident's, in seconds of wall time (definitions in ``goodput``'s docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Incident:
    generation: int
    action: str | None  # restart / reschedule / abort / continue; None: no decision (yet)
    reason: str | None
    rule: str | None
    detail: str
    rank: int | None  # the rank the classification blames, else the first failing one
    sign: str  # the event that first showed the failure: rank_exited, rank_hung...
    failed_at: float
    noticed_at: float
    detection: float
    restart: float | None
    recomputation: float
    checkpoint_at: float | None  # the checkpoint recomputation counts from
    iterations_lost: int | None
    # a hang across the job: the culprit's node (node rank) and the rule of the job's blame;
    # ``rank`` is then the job's culprit, on every node alike
    node: int | None = None
    blame: str | None = None

    @property
    def lost(self) -> float:
        return self.detection + (self.restart or 0.0) + self.recomputation

    def to_json(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__slots__}
        out["lost"] = self.lost
        return out


@dataclass(frozen=True, slots=True)
class Summary:
    started_at: float | None
    ended_at: float | None
    finished: bool  # every daemon run that started has finished
    wall: float
    productive: float
    detection: float
    restart: float
    recomputation: float
    restarts: int  # generations after the first
    generations: int
    checkpoints: int  # checkpoints saved (reports, every rank)
    last_iteration: int | None
    incidents: tuple[Incident, ...] = ()
    stepping_at: float | None = None  # the first generation all stepping: start-up over
    # whether any rank reported a step (the client does): without, a generation is known
    # only to have started, so restarts are measured to every rank started, and
    # ``productive`` is the ranks' running time, start-up included: no goodput is claimed
    steps_known: bool = True

    @property
    def lost(self) -> float:
        return self.detection + self.restart + self.recomputation

    @property
    def goodput(self) -> float | None:
        """productive / wall; None where the ranks report no steps (unknown, not guessed)."""
        if not self.steps_known:
            return None
        return min(1.0, self.productive / self.wall) if self.wall > 0 else 0.0

    @property
    def overhead(self) -> float:
        """Neither productive nor lost to an incident: start-up, shutdown."""
        return max(0.0, self.wall - self.productive - self.lost)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in self.__slots__}
        out.update(lost=self.lost, goodput=self.goodput, overhead=self.overhead)
        out["incidents"] = [i.to_json() for i in self.incidents]
        return out
