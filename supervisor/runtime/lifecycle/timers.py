"""One timer per rank, armed at that rank's next deadline.

A heartbeat only ever moves a deadline later, so a timer is left alone and
re-armed when it fires early; it is re-armed at once only when a deadline moves
earlier (a section opened). A hang is thus seen within a millisecond or so of
its deadline, at no polling cost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from supervisor.clock import Clock


@dataclass
class _Timer:
    handle: asyncio.TimerHandle
    at: float  # the deadline it was armed for (monotonic)


class Timers:
    def __init__(self, clock: Clock, fire: Callable[[int, float | None], None]) -> None:
        """``fire(rank, armed_for)``: the rank's timer went off (``armed_for``: its deadline)."""
        self._clock, self._fire = clock, fire
        self._timers: dict[int, _Timer] = {}

    def arm(self, rank: int, at: float | None, now: float) -> None:
        """The rank's next deadline is ``at`` (None: it has none)."""
        current = self._timers.get(rank)
        if at is None:
            self.cancel(rank)
        elif current is None or at < current.at:
            self.cancel(rank)
            handle = self._clock.call_later(max(0.0, at - now), lambda: self._fired(rank))
            self._timers[rank] = _Timer(handle, at)

    def _fired(self, rank: int) -> None:
        timer = self._timers.pop(rank, None)
        self._fire(rank, None if timer is None else timer.at)

    def cancel(self, rank: int) -> None:
        timer = self._timers.pop(rank, None)
        if timer is not None:
            timer.handle.cancel()

    def cancel_all(self) -> None:
        for rank in list(self._timers):
            self.cancel(rank)
