"""An event loop whose time is virtual: when nothing is ready and nothing is working,
time jumps to the next timer, so a daemon's 30-second deadline passes at once.

Deterministic by construction: time moves only when no callback is ready, no file
descriptor is readable, no job is running in an executor and no transient thread
(``off_loop``, ``in_thread``) is alive. Nothing here runs a real process: a real
process's exit would race virtual time.
"""

from __future__ import annotations

import asyncio
import selectors
import threading
from collections.abc import Callable
from typing import Any

from supervisor.clock import Clock

START = 1e9  # beyond any real uptime: the kernel log's real lines are never "since" a virtual time
# threads that live for the whole test and idle (they are not work in progress)
RESIDENT = ("asyncio_", "ThreadPoolExecutor", "console", "MainThread", "ft-checkpoints", "ft-checksum-pool")
REAL_WAIT = 0.002  # seconds of real time to let a working thread or a pipe deliver


class _Selector(selectors.BaseSelector):
    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._inner = selectors.DefaultSelector()
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if self._loop.busy():
            return self._inner.select(REAL_WAIT if timeout is None else min(timeout, REAL_WAIT))
        if timeout is None:  # nothing scheduled and nothing working: what comes, comes from outside
            return self._inner.select(REAL_WAIT)
        self._loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__(selector=_Selector(self))
        self._now = START
        # a timer is due once its time is within the resolution of now: at START, a
        # nanosecond is below a float's precision, and a timer due "now" would never run
        self._clock_resolution = 1e-6
        self._jobs = 0  # executor jobs not done yet
        # a thread alive before the scenario began is not its work: one an earlier test of
        # the worker left running (a rendezvous keep-alive) held time still, for good
        self._before = frozenset(threading.enumerate())  # the objects: a new thread may reuse an ident

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(0.0, seconds)

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        future = super().run_in_executor(executor, func, *args)
        self._jobs += 1
        future.add_done_callback(self._job_done)
        return future

    def _job_done(self, _: asyncio.Future[Any]) -> None:
        self._jobs -= 1

    def busy(self) -> bool:
        if self._jobs:
            return True
        working = [
            t
            for t in threading.enumerate()
            if t.is_alive() and not t.name.startswith(RESIDENT) and t not in self._before
        ]
        return bool(working)


class LoopClock(Clock):
    """The daemon's clock on a ``VirtualTimeLoop``: monotonic time is the loop's (also
    when read from a worker thread), wall time moves with it."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self.loop = loop

    def monotonic(self) -> float:
        return self.loop.time()  # type: ignore[attr-defined, no-any-return]

    def wall(self) -> float:
        return 1.7e9 + self.monotonic()

    def wall_ns(self) -> int:
        return int(self.wall() * 1e9)
