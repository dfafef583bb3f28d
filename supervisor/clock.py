"""The daemon's only clock: every time it reads and every pause it takes.

Core functions take ``now`` as a parameter instead. The runtime's fast tests run
the daemon on an event loop with virtual time and pass a clock that reads it, so
that deadlines, timeouts and sleeps all follow one time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio


class Clock:
    # Holds nothing and takes nothing: a plain class (a frozen dataclass imports
    # dataclasses, and asyncio below is imported where it is used: the orphan sentinel,
    # a process per daemon, standard library only, takes this clock for its pauses,
    # and these imports were half its CPU)
    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def wall_ns(self) -> int:
        return time.time_ns()

    async def sleep(self, seconds: float) -> None:
        import asyncio  # noqa: PLC0415

        await asyncio.sleep(seconds)

    def call_later(self, seconds: float, fn: Callable[[], object]) -> asyncio.TimerHandle:
        """Run ``fn`` on the running loop ``seconds`` from now."""
        import asyncio  # noqa: PLC0415

        return asyncio.get_running_loop().call_later(seconds, fn)

    def pause(self, seconds: float) -> None:
        """Block this thread (for code that runs in a worker thread, never on the loop)."""
        time.sleep(seconds)


SYSTEM = Clock()
