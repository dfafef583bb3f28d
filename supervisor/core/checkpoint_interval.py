"""The checkpoint interval the run's own figures call for.

The availability-optimal interval (arXiv 2410.18124), from one save's start to the next's::

    Tc = Ts + sqrt(2 (Tf + Tr) Ts + Ts^2)

Ts  the time a save takes: the median of the last ``SAVES`` completed ``checkpointing``
    sections (any rank; a section an exception closed is no measure of a save);
Tf  the mean time to failure: the time the ranks trained divided by the failures seen.
    A generation trains from the moment every rank spawned for it has completed a step
    (``rank_stepping``) to its first failure noticed or its end; the current one up to
    now. A failure is what ``supervisor.core.recovery`` counts: a rank that exited
    failed or reported its failure, a hang, a peer node's news, an operator's restart,
    a workload's request; once per generation;
Tr  the recovery time: the median of the last ``RECOVERIES`` recoveries
    (``supervisor.core.recovery``: a failure noticed -> every rank of the next
    generation stepping).

Before there is enough to go on there is no advice, and ``why`` says what is missing:
no save measured yet (Ts unknown), or no failure yet (Tf unknown: a run that has not
failed says nothing about how often it fails). A prior ``mtbf`` (``--mtbf``) stands for
one failure after that many seconds of training, so the advice starts from it and moves
towards what is measured as failures come: ``Tf = (trained + mtbf) / (failures + 1)``.
A failure whose recovery has not completed yet leaves Tr unmeasured; it then counts as
0 (reported as None), which Tf dwarfs in any run where the advice matters.

With memory snapshots (``client.snapshot``) a failure whose next generation restored
from one (``snapshot_restored``, from memory or a peer's replica) cost a step, not a disk
checkpoint's interval: only the failures the held snapshots did not cover (the whole job
or its daemons lost, no common step) send the ranks back to the disk. Tf is then the
mean time between those: the disk interval becomes a question of whole-job failures.
``covered`` counts the others; until one is not covered, and without a prior, there is no
advice and ``why`` says so.

Memory is bounded: the last ``SAVES`` save times, the last ``RECOVERIES`` recovery
times, and the ranks of the generations in flight. Pure: time comes in as ``now``
(monotonic seconds, the events' ``t_mono``).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.catalogue.generation import GenerationEnded, GenerationStarted
from supervisor.core.catalogue.job import NodeMoved
from supervisor.core.catalogue.ranks import RankSpawned, RankStepping
from supervisor.core.catalogue.snapshots import SnapshotRestored
from supervisor.core.recovery import Recovery, is_failure

SAVES = 32
RECOVERIES = 16
MATERIAL = 0.1  # an advice that moved by more than this share is news (an event)


def optimal_interval(ts: float, tf: float, tr: float) -> float:
    """``Ts + sqrt(2 (Tf + Tr) Ts + Ts^2)`` in seconds; every input finite and >= 0."""
    if not all(math.isfinite(x) and x >= 0 for x in (ts, tf, tr)):
        raise ValueError(f"Ts, Tf, Tr must be finite and >= 0: {ts!r}, {tf!r}, {tr!r}")
    return ts + math.sqrt(2 * (tf + tr) * ts + ts * ts)


@dataclass(frozen=True, slots=True)
class Advice:
    """The advised interval and what it was computed from (seconds; None: unknown)."""

    seconds: float | None
    ts: float | None
    tf: float | None
    tr: float | None
    saves: int  # saves measured in the run
    failures: int
    recoveries: int  # recoveries measured
    trained: float  # seconds the ranks trained
    prior: float | None  # the --mtbf prior, when one was given
    why: str = ""  # when there is no advice: what is missing
    covered: int = 0  # failures whose next generation restored from a memory snapshot

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def news_after(self, last: Advice | None) -> bool:
        """Worth telling, after ``last`` was told: advice where there was none (or none
        any more), a failure or a recovery more, or an interval that moved materially."""
        if last is None:
            return self.seconds is not None
        if (self.seconds is None) != (last.seconds is None):
            return True
        if self.seconds is None or last.seconds is None:
            return False
        if (self.failures, self.recoveries) != (last.failures, last.recoveries):
            return True
        return abs(self.seconds - last.seconds) > MATERIAL * last.seconds


@dataclass(slots=True)
class _Generation:
    ranks: set[int] = field(default_factory=set)
    stepping: set[int] = field(default_factory=set)
    training_since: float | None = None  # every rank stepped (t_mono)
    over: bool = False  # failed or ended: it trains no more


class Advisor:
    """Fed save times (``saved``) and the daemon's events (``add``), in order; what it is
    fed never makes it raise (an event without the fields it reads is ignored)."""

    def __init__(self, mtbf: float | None = None) -> None:
        if mtbf is not None and not (math.isfinite(mtbf) and mtbf > 0):
            raise ValueError(f"mtbf must be a positive number of seconds: {mtbf!r}")
        self.mtbf = mtbf
        self._saves: deque[float] = deque(maxlen=SAVES)
        self._saved = 0
        self._recoveries: deque[float] = deque(maxlen=RECOVERIES)
        self._recovered = 0
        self._recovery = Recovery()
        self._gens: dict[int, _Generation] = {}
        self._current: int | None = None
        self._trained = 0.0  # by generations that no longer train
        self.failures = 0
        self.covered = 0
        self._failed: set[int] = set()  # generations that ended on a failure (the last few)
        self._covered: set[int] = set()  # of those, the ones the next generation restored from memory

    def saved(self, seconds: float) -> None:
        """A completed save took ``seconds``."""
        if math.isfinite(seconds) and seconds >= 0:
            self._saves.append(seconds)
            self._saved += 1

    def add(self, name: str, record: Mapping[str, Any]) -> bool:
        """File one event; True when it changed Tf or Tr (a failure, a recovery)."""
        try:
            recovered = self._recovery.add(name, record)
        except (KeyError, TypeError, ValueError):  # it reads the fields it needs unchecked
            recovered = None
        if recovered is not None:
            self._recoveries.append(recovered)
            self._recovered += 1
        generation, t, rank = record.get("generation"), record.get("t_mono"), record.get("rank")
        if not isinstance(generation, int) or not isinstance(t, int | float):
            return recovered is not None
        failed = False
        if name == RankSpawned.NAME and isinstance(rank, int):
            self._gens.setdefault(generation, _Generation()).ranks.add(rank)
        elif name == NodeMoved.NAME:
            self._gens.pop(generation, None)  # respawned for the node's new place: new ranks
        elif name == GenerationStarted.NAME:
            self._current = generation
            # prepared generations that never started are forgotten, and so are old ones
            self._gens = {g: gen for g, gen in self._gens.items() if g >= generation}
        elif name == RankStepping.NAME and isinstance(rank, int):
            self._stepped(generation, rank, float(t))
        elif name == GenerationEnded.NAME:
            self._over(generation, float(t))
        elif is_failure(name, record) and generation == self._current:
            failed = self._over(generation, float(t), failure=True)
            if failed:
                self._failed = {g for g in self._failed if g > generation - RECOVERIES} | {generation}
        elif name == SnapshotRestored.NAME and record.get("source") in ("memory", "peer"):
            covered = generation - 1
            if covered in self._failed and covered not in self._covered:
                self._covered = {g for g in self._covered if g > generation - RECOVERIES} | {covered}
                self.covered += 1
                return True
        return failed or recovered is not None

    def _stepped(self, generation: int, rank: int, t: float) -> None:
        gen = self._gens.get(generation)
        if gen is None or gen.over or generation != self._current:
            return
        gen.stepping.add(rank)
        if gen.training_since is None and gen.stepping >= gen.ranks:
            gen.training_since = t

    def _over(self, generation: int, t: float, *, failure: bool = False) -> bool:
        """The generation trains no more; True when this is its (first) failure."""
        gen = self._gens.setdefault(generation, _Generation())
        if gen.over:
            return False
        gen.over = True
        if gen.training_since is not None:
            self._trained += max(0.0, t - gen.training_since)
        if failure:
            self.failures += 1
        return failure

    def trained(self, now: float) -> float:
        """Seconds the ranks trained so far."""
        gen = self._gens.get(self._current) if self._current is not None else None
        running = 0.0
        if gen is not None and not gen.over and gen.training_since is not None:
            running = max(0.0, now - gen.training_since)
        return self._trained + running

    def advice(self, now: float) -> Advice:
        trained = self.trained(now)
        ts = statistics.median(self._saves) if self._saves else None
        tr = statistics.median(self._recoveries) if self._recoveries else None
        tf: float | None
        to_disk = self.failures - self.covered  # the failures that went back to a disk checkpoint
        if self.mtbf is not None:
            tf = (trained + self.mtbf) / (to_disk + 1)
        elif to_disk:
            tf = trained / to_disk
        else:
            tf = None
        why = ""
        if ts is None:
            why = "no save measured yet (a completed `checkpointing` section, when monitored)"
        elif tf is None and self.covered:
            why = (f"every failure so far ({self.covered}) restored from memory snapshots: the disk interval "
                   "depends on whole-job failures only, none seen yet (--mtbf gives a prior)")  # fmt: skip
        elif tf is None:
            why = "no failure seen yet: the mean time to failure is unknown (--mtbf gives a prior)"
        seconds = None if why else optimal_interval(ts or 0.0, tf or 0.0, tr or 0.0)
        counts = (self._saved, self.failures, self._recovered)
        return Advice(seconds, ts, tf, tr, *counts, trained, self.mtbf, why, self.covered)


def describe(advice: Mapping[str, Any]) -> str:
    """One line for people (status, the run report): the advice and its figures, or why none."""
    if advice.get("seconds") is None:
        return f"checkpoint interval: no advice yet: {advice.get('why')}"

    def s(key: str) -> str:
        value = advice.get(key)
        return "-" if not isinstance(value, int | float) else f"{value:.2f} s"

    prior = "" if advice.get("prior") is None else f" and the {s('prior')} prior"
    if advice.get("covered"):
        prior += f"; {advice.get('covered')} restored from memory, not counted"
    return (
        f"checkpoint interval: advised {s('seconds')} (a save Ts {s('ts')}, median of "
        f"{advice.get('saves')} measured; mean time to failure Tf {s('tf')}, from {s('trained')} "
        f"trained, {advice.get('failures')} failure(s){prior}; recovery Tr {s('tr')}, median of "
        f"{advice.get('recoveries')})"
    )
