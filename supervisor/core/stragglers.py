"""Stragglers: which rank of the node does its own work slower than the others.

In a synchronous job every rank's step lasts as long as the slowest one's: the
others wait for it in the collectives. So the measure is a rank's *own work*
per step, not its step: the step minus the time it waited in collectives
(measured inside the rank by the client's DDP hook or ``client.waiting()``), or,
for ranks that do not communicate, the ``step`` section itself.

A rank's score is the median of its last ``window`` samples over the node's
reference: the *lower* median of the ranks' medians. The lower median, because
with two ranks the plain median would sit halfway to the straggler and hide it;
with more ranks it is the typical rank as long as fewer than half are slow.
Medians make a few evaluation or checkpoint steps, which every rank or one rank
takes now and then, irrelevant; the first ``warmup`` samples of a rank in a
generation are skipped (compilation, allocator, DDP's bucket rebuild).

With several nodes, each publishes its ranks' medians through the rendezvous
store at a low rate, and a rank is also scored against the job's typical rank
(the lower median over every node's ranks); its score is the higher of the two,
so a node whose ranks are all slow (a throttled node, a slow link) is seen too.

A score at or above ``threshold`` for ``sustain`` seconds flags the rank; below
``clear`` for as long clears it (hysteresis: a rank near the threshold does not
flap). Time is a parameter; memory is bounded by ``window`` samples per rank.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from supervisor.core.types import Action, Decision, Reason


class StragglerAction(StrEnum):
    REPORT = "report"  # events, status, metric: nothing more
    RESTART = "restart"  # restart the job in place (a restart the budget pays for)
    RESCHEDULE = "reschedule"  # send this node away with the reschedule code, as a hardware fault


@dataclass(frozen=True, slots=True)
class StragglerSettings:
    enabled: bool = True
    threshold: float = 1.2  # a rank this many times slower than the node's reference is straggling
    clear: float = 1.1  # ...and no longer once below this
    window: int = 16  # samples per rank its score is the median of
    warmup: int = 5  # first samples of a rank in a generation, skipped
    sustain: float = 10.0  # seconds a score must stay above (below) to flag (clear)
    interval: float = 1.0  # seconds between two evaluations
    action: StragglerAction = StragglerAction.REPORT

    def __post_init__(self) -> None:
        if self.threshold <= 1.0:
            raise ValueError("the straggler threshold must be > 1")
        if not 1.0 <= self.clear <= self.threshold:
            raise ValueError("the straggler clear level must be between 1 and the threshold")
        if self.window < 3 or self.warmup < 0 or self.sustain < 0 or self.interval <= 0:
            raise ValueError("window >= 3, warmup >= 0, sustain >= 0, interval > 0")


@dataclass(frozen=True, slots=True)
class Standing:
    """One rank's verdict over time, as a value."""

    flagged: bool = False
    since: float | None = None  # when the score crossed the level that would change the verdict
    score: float | None = None


@dataclass(frozen=True, slots=True)
class Change:
    """A rank became a straggler (``detected``) or stopped being one."""

    detected: bool
    rank: int
    score: float
    work: float  # the rank's median own work per step (seconds)
    reference: float  # the node's reference (seconds)
    samples: int  # how many samples the score is the median of
    sustained: float  # seconds the score stayed across the level before the change
    against: str = "node"  # whose typical rank the score compares with: the node's or the job's


def judged(standing: Standing, score: float, now: float, s: StragglerSettings) -> Standing:
    """The rank's standing after a new score at ``now``."""
    crossing = score < s.clear if standing.flagged else score >= s.threshold
    if not crossing:
        return Standing(standing.flagged, None, score)
    since = now if standing.since is None else standing.since
    if now - since >= s.sustain:
        return Standing(not standing.flagged, None, score)
    return Standing(standing.flagged, since, score)


def scores(medians: Mapping[int, float]) -> dict[int, float]:
    """Each rank's median over the node's reference (the lower median of the medians)."""
    reference = _reference(medians)
    return {} if reference is None else {rank: m / reference for rank, m in medians.items()}


def _reference(medians: Mapping[int, float]) -> float | None:
    if len(medians) < 2:
        return None
    reference = statistics.median_low(medians.values())
    return reference if reference > 0 else None


@dataclass(frozen=True, slots=True)
class Score:
    value: float
    reference: float
    against: str  # "node" | "job"


def scored(medians: Mapping[int, float], peers: Mapping[int, float]) -> dict[int, Score]:
    """This node's ranks scored against the node's and, with ``peers`` (the other nodes'
    ranks' medians), the job's typical rank: the higher of the two."""
    out: dict[int, Score] = {}
    for against, pool in (("node", medians), ("job", {**peers, **medians} if peers else {})):
        reference = _reference(pool)
        if reference is None:
            continue
        for rank, m in medians.items():
            if rank not in out or m / reference > out[rank].value:
                out[rank] = Score(m / reference, reference, against)
    return out


@dataclass
class _Samples:
    seen: int = 0
    values: deque[float] = field(default_factory=deque)


class Tracker:
    """The node's ranks' samples and standings in one generation."""

    def __init__(self, settings: StragglerSettings) -> None:
        self.settings = settings
        self._samples: dict[int, _Samples] = {}
        self._timed: set[int] = set()  # ranks measured inside (client): their step sections no longer count
        self.standings: dict[int, Standing] = {}
        self.reference: float | None = None
        self.peers: dict[int, float] = {}  # the other nodes' ranks' medians, when they are shared
        self._last = float("-inf")

    def add(self, rank: int, work: float, *, measured: bool) -> None:
        """A sample of ``rank``'s own work (seconds); ``measured``: by the client, waits
        taken out, rather than a step section's length seen from here."""
        if measured:
            if rank not in self._timed:
                self._timed.add(rank)
                self._samples.pop(rank, None)  # section lengths include waits: start over
        elif rank in self._timed:
            return
        s = self._samples.get(rank)
        if s is None:
            s = self._samples[rank] = _Samples(values=deque(maxlen=self.settings.window))
        s.seen += 1
        if s.seen > self.settings.warmup:
            s.values.append(work)

    def due(self, now: float) -> bool:
        return now - self._last >= self.settings.interval

    def medians(self) -> dict[int, float]:
        """Ranks with a full window, and their median own work."""
        n = self.settings.window
        return {r: statistics.median(s.values) for r, s in self._samples.items() if len(s.values) >= n}

    def evaluate(self, now: float) -> list[Change]:
        """Score every rank with a full window; what changed."""
        self._last = now
        medians = self.medians()
        peers = {r: m for r, m in self.peers.items() if r not in self._samples}
        by_rank = scored(medians, peers)
        self.reference = min((s.reference for s in by_rank.values()), default=None)
        changes = []
        for rank, score in by_rank.items():
            before = self.standings.get(rank, Standing())
            after = judged(before, score.value, now, self.settings)
            self.standings[rank] = after
            if after.flagged != before.flagged:
                sustained = now - (before.since if before.since is not None else now)
                changes.append(Change(after.flagged, rank, score.value, medians[rank], score.reference,
                                      len(self._samples[rank].values), sustained, score.against))  # fmt: skip
        return changes

    def measured(self) -> list[int]:
        """Ranks whose samples their clients measure (waits taken out)."""
        return sorted(self._timed)

    def flagged(self) -> list[int]:
        return sorted(r for r, s in self.standings.items() if s.flagged)

    def standing(self, rank: int) -> Standing | None:
        return self.standings.get(rank)


def decision(change: Change, settings: StragglerSettings, restarts_left: int, node: str) -> Decision | None:
    """What a detected straggler makes the node do; None: only report it.

    A restart is one the budget pays for (none left: report only); leaving the node
    is bounded the same way, so that a job that keeps landing on slow nodes stops
    spending them once its restarts are gone.
    """
    if not change.detected or settings.action is StragglerAction.REPORT or restarts_left <= 0:
        return None
    action = Action.RESTART if settings.action is StragglerAction.RESTART else Action.RESCHEDULE
    detail = (
        f"rank {change.rank} on {node} straggles: its own work per step {change.work:.4g} s is "
        f"{change.score:.2f}x the {change.against}'s {change.reference:.4g} s over {change.samples} steps, "
        f"for {change.sustained:.0f} s (--straggler-action {settings.action})"
    )
    return Decision(action, Reason.STRAGGLER, detail)


