"""Straggler detection in the daemon: samples in, events and decisions out.

The monitor hands over each step's own work as it arrives (a client's timing, or
a ``step`` section's length); ``core.stragglers`` scores the node's ranks at most
once per interval. A change is one event (``straggler_detected`` with rank,
node, score and window; ``straggler_cleared``), and a detection goes to ``act``,
where the daemon applies ``--straggler-action``.

With several nodes, the node's medians go to the job (``share``: the rendezvous
store, published off the loop by the job's watcher) and the other nodes' come back
(``nodes``: every node's last published status), at most every few seconds.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from supervisor.clock import Clock
from supervisor.core.catalogue.ranks import StragglerCleared, StragglerDetected, StragglerScoring
from supervisor.core.stragglers import Change, StragglerSettings, Tracker
from supervisor.runtime.records.events import EventLog

SHARE_EVERY = 5.0  # seconds, at most, between two exchanges of medians with the other nodes


class Stragglers:
    def __init__(
        self,
        settings: StragglerSettings,
        events: EventLog,
        clock: Clock,
        *,
        generation: Callable[[], int | None],
        act: Callable[[Change], None] = lambda change: None,
        share: Callable[[dict[str, Any]], None] = lambda shared: None,
        nodes: Callable[[], Sequence[Mapping[str, Any]]] = list,
    ) -> None:
        self.settings = settings
        self.node = socket.gethostname()
        self._events = events
        self._clock = clock
        self._generation = generation  # the monitor's: samples of another generation start afresh
        self._act = act
        self._tracker = Tracker(settings)
        self._of: int | None = None
        self._scoring = False  # said, once per generation, that its ranks are being scored
        self._share, self._nodes = share, nodes
        self._shared_at = float("-inf")
        # a low rate, but within a sustain: a job-wide straggler is flagged about as soon
        self._share_every = min(SHARE_EVERY, max(settings.interval, settings.sustain))

    def work(self, rank: int, seconds: float, measured: bool) -> None:
        """One step's own work of ``rank`` (``measured``: by its client, waits taken out)."""
        if not self.settings.enabled:
            return
        generation = self._generation()
        if generation != self._of:
            self._tracker, self._of, self._scoring = Tracker(self.settings), generation, False
        self._tracker.add(rank, seconds, measured=measured)
        now = self._clock.monotonic()
        if now - self._shared_at >= self._share_every:
            self._exchange(now)
        if self._tracker.due(now):
            for change in self._tracker.evaluate(now):
                self._tell(change)
            reference = self._tracker.reference
            if not self._scoring and reference is not None:
                self._scoring = True  # detection is live: with what, against what
                t = self._tracker
                self._events.emit(StragglerScoring(generation=generation,
                                                   ranks=sorted(t.standings), measured=t.measured(),
                                                   reference=round(reference, 6)))  # fmt: skip

    def _exchange(self, now: float) -> None:
        """Publish this node's medians; take the other nodes' of the same generation."""
        self._shared_at = now
        medians = self._tracker.medians()
        if medians:
            rounded = {str(r): round(m, 6) for r, m in medians.items()}
            self._share({"generation": self._of, "medians": rounded})
        peers: dict[int, float] = {}
        for node in self._nodes():
            shared = node.get("stragglers")
            if not isinstance(shared, Mapping) or shared.get("generation") != self._of:
                continue
            raw = shared.get("medians")
            for rank, m in (raw.items() if isinstance(raw, Mapping) else ()):
                if isinstance(m, int | float) and not isinstance(m, bool) and m > 0 and str(rank).isdigit():
                    peers[int(rank)] = float(m)
        self._tracker.peers = peers  # this node's own ranks among them are left out

    def _tell(self, c: Change) -> None:
        record = StragglerDetected if c.detected else StragglerCleared  # at WARNING, at INFO
        self._events.emit(record(
            generation=self._of, rank=c.rank,
            node=self.node, score=round(c.score, 3), window=c.samples, work=round(c.work, 6),
            reference=round(c.reference, 6), sustained=round(c.sustained, 3), against=c.against,
            action=str(self.settings.action),
        ))  # fmt: skip
        if c.detected:
            self._act(c)

    def annotate(self, rows: list[dict[str, Any]]) -> None:
        """Add each rank's score (None until its window is full) and flag to status rows."""
        if not self.settings.enabled:
            return
        for row in rows:
            standing = self._tracker.standing(row["rank"])
            score = None if standing is None else standing.score
            row["straggler_score"] = None if score is None else round(score, 3)
            row["straggler"] = standing is not None and standing.flagged
