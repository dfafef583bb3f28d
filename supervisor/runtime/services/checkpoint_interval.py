"""The advised checkpoint interval, live (``supervisor.core.checkpoint_interval``).

Two feeds, both on the event loop: the monitor hands over each completed save's time
(``saved``), and every event passes through ``on_event`` (an ``EventLog`` listener)
for the failures and recoveries. Whenever the advice becomes news (it appears, a
failure or a recovery changes it, or it moved by more than a tenth) it is told as a
``checkpoint_interval_advised`` event: what ``ft-supervisor report`` reads afterwards.
``status``, the metrics and the ranks' questions (``client.advised_checkpoint_interval``)
get it computed at the moment they ask.
"""

from __future__ import annotations

import asyncio
from typing import Any

from supervisor.clock import Clock
from supervisor.core.catalogue.checkpoints import CheckpointIntervalAdvised
from supervisor.core.checkpoint_interval import Advice, Advisor
from supervisor.runtime.records.events import EventLog


class IntervalAdvice:
    def __init__(self, events: EventLog, clock: Clock, mtbf: float | None = None) -> None:
        self._advisor = Advisor(mtbf)
        self._events = events
        self._clock = clock
        self._told: Advice | None = None
        self._pending = False
        events.listeners.append(self.on_event)

    def saved(self, rank: int, seconds: float) -> None:
        self._advisor.saved(seconds)
        self._tell()

    def on_event(self, name: str, record: dict[str, Any]) -> None:
        if name == CheckpointIntervalAdvised.NAME or not self._advisor.add(name, record) or self._pending:
            return
        # told on the next turn, not from inside this event's emission: the listeners
        # after this one must see that event before ours
        self._pending = True
        try:
            asyncio.get_running_loop().call_soon(self._tell)
        except RuntimeError:  # no loop (the daemon's last events): at once
            self._tell()

    def now(self) -> Advice:
        return self._advisor.advice(self._clock.monotonic())

    def describe(self) -> dict[str, Any]:
        return self.now().to_json()

    def _tell(self) -> None:
        self._pending = False
        advice = self.now()
        if advice.news_after(self._told):
            self._told = advice
            a = advice
            self._events.emit(
                CheckpointIntervalAdvised(
                    seconds=a.seconds, ts=a.ts, tf=a.tf, tr=a.tr, saves=a.saves, failures=a.failures,
                    recoveries=a.recoveries, trained=a.trained, prior=a.prior, why=a.why, covered=a.covered,
                )
            )  # fmt: skip
