"""The daemon's only clock: every time it reads and every pause it takes.

Core functions take ``now`` as a parameter instead. The runtime's fast tests run
the daemon on an event loop with virtual time and pass a clock that reads it, so
that deadlines, timeouts and sleeps all follow one time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Clock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def wall_ns(self) -> int:
        return time.time_ns()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, seconds: float, fn: Callable[[], object]) -> asyncio.TimerHandle:
        """Run ``fn`` on the running loop ``seconds`` from now."""
        return asyncio.get_running_loop().call_later(seconds, fn)

    def pause(self, seconds: float) -> None:
        """Block this thread (for code that runs in a worker thread, never on the loop)."""
        time.sleep(seconds)


SYSTEM = Clock()
