"""Commands to the daemon: stop signals, reload and forwarded signals, SIGUSR1's
status, and the control endpoint's stop, restart and status requests."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

from supervisor.core.catalogue.daemon import Status, StopForced, StopRequested
from supervisor.core.catalogue.generation import RestartRequested
from supervisor.core.types import signal_name
from supervisor.runtime.lifecycle import signals
from supervisor.runtime.lifecycle.hosting import Hosting
from supervisor.runtime.lifecycle.loop import Loop
from supervisor.runtime.records.events import EventLog


class Commands:
    def __init__(
        self, loop: Loop, *, events: EventLog, hosting: Hosting, stopping: asyncio.Event,
        force: asyncio.Event, status: Callable[[], dict[str, Any]],
    ) -> None:  # fmt: skip
        self.queue: asyncio.Queue[signals.Command] = asyncio.Queue()
        self._loop, self._events, self._hosting = loop, events, hosting
        self._stopping, self._force, self._status = stopping, force, status

    async def dispatch(self) -> None:
        while True:
            command = await self.queue.get()
            if isinstance(command, signals.Stop):
                self._stop(command.signum)
            elif isinstance(command, signals.Reload | signals.Forward):
                self._hosting.handle(command, self._loop.current)
            else:
                self._events.emit(Status(**self._status()))

    def _stop(self, signum: int) -> None:
        """The first stop signal stops the run; a second SIGINT skips the graces."""
        if self._loop.stop_signal is None:
            self._loop.stop_signal = signum
            self._events.emit(StopRequested(signal=signal_name(signum)))
            self._stopping.set()
        elif signum == signal.SIGINT and not self._force.is_set():
            self._events.emit(StopForced(signal=signal_name(signum)))
            self._force.set()

    def control(self, command: str) -> Any:
        """A request on the control endpoint; what it answers."""
        if command == "stop":
            self.queue.put_nowait(signals.Stop(signal.SIGTERM))
            return {"stopping": True}
        if command == "restart":
            gen = self._loop.current
            if gen is None or gen.ended.is_set():
                raise RuntimeError("no running generation to restart")
            self._events.emit(RestartRequested(generation=gen.number))
            gen.request_restart()
            return {"restarting": gen.number}
        return self._status()
