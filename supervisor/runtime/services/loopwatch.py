"""The daemon watches its own loop: time it was stalled is not charged to the ranks.

A daemon stopped (SIGSTOP, a paused container), starved of CPU or memory, or held
by a long piece of work cannot read the ranks' messages meanwhile; when it runs
again, deadlines look missed that the ranks never missed. So a tick runs every
``INTERVAL`` s; a tick that comes more than ``THRESHOLD`` s late means the loop
was stalled since the tick before it. The stall is announced (``daemon_stalled``)
and kept (a bounded list of intervals): deadlines are counted in time the daemon
was awake (``supervisor.core.watch``), so a rank gets the time it was owed.
"""

from __future__ import annotations

import asyncio
from collections import deque

from supervisor.clock import Clock
from supervisor.core.catalogue.services import DaemonStalled
from supervisor.runtime.records.events import EventLog

INTERVAL = 0.1  # seconds between ticks
THRESHOLD = 0.5  # a tick this late means the loop was stalled
KEPT = 32  # stalls remembered: deadlines reach back no further than the longest timeout


class LoopWatch:
    def __init__(self, clock: Clock, events: EventLog) -> None:
        self._clock = clock
        self._events = events
        self.stalls: deque[tuple[float, float]] = deque(maxlen=KEPT)  # (from, to), monotonic
        self.worst_lag = 0.0  # the longest delay of a tick that was not a stall
        self.stalled_total = 0.0

    async def run(self) -> None:
        """Tick until cancelled. A timer callback, not a task's sleep: after a stall the
        loop runs due timers in order, so the tick (due first) is seen before any deadline
        that fell in the stall is judged; a task would resume only after them."""
        loop = asyncio.get_running_loop()
        last = self._clock.monotonic()
        handle: asyncio.TimerHandle | None = None

        def tick() -> None:
            nonlocal last, handle
            now = self._clock.monotonic()
            self.tick(last, now)
            last = now
            handle = self._clock.call_later(INTERVAL, tick)

        handle = self._clock.call_later(INTERVAL, tick)
        try:
            await loop.create_future()
        finally:
            handle.cancel()

    def tick(self, last: float, now: float) -> None:
        lag = now - last - INTERVAL
        if lag <= THRESHOLD:
            self.worst_lag = max(self.worst_lag, lag)
            return
        # the loop ran until the last tick at least; credit the ranks from there
        self.stalled(last, now)

    def stalled(self, start: float, end: float) -> None:
        """The loop did not run from ``start`` to ``end`` (a tick, or a timer, came that late)."""
        if self.stalls and start <= self.stalls[-1][1]:  # the same stall, seen again
            first, last = self.stalls[-1]
            if end <= last:
                return
            self.stalls[-1] = (min(first, start), end)
            self.stalled_total += end - last
            return
        self.stalls.append((start, end))
        self.stalled_total += end - start
        self._events.emit(
            DaemonStalled(seconds=round(end - start, 3), detail="not charged to the ranks' deadlines")
        )
