"""The next generation, from its preparation to its launch: the one owner of its clean-up.

Ranks spawned for a generation that never gets its go (generation 0 when the job
ends before it starts, a standby the run no longer needs, ranks spawned for a
place in the job this node lost) are stopped here and nowhere else, whichever
way the daemon leaves its loop: a stop signal, the job ending, an error.
"""

from __future__ import annotations

import asyncio

from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.launcher import Launcher


class Upcoming:
    def __init__(self, launcher: Launcher, stopping: asyncio.Event) -> None:
        self._launcher = launcher
        self._stopping = stopping
        self._preparing: asyncio.Future[Generation | None] | None = None
        self._cancellable = False
        self._held: Generation | None = None

    def preparing(self, task: asyncio.Future[Generation | None], *, cancellable: bool = False) -> None:
        """The next generation is being prepared by ``task``. A ``cancellable`` one is
        cancelled by a stop (the fork server's first import must not hold it up); any
        other is awaited (a standby's preparation stops by itself on a stop)."""
        self._preparing, self._cancellable = task, cancellable

    async def take(self) -> Generation | None:
        """The prepared generation (None: there is none), held until ``launched``."""
        task, self._preparing = self._preparing, None
        gen = None if task is None else await task
        self.hold(gen)
        return gen

    def hold(self, gen: Generation | None) -> None:
        self._held = gen

    def launched(self) -> Generation:
        """The held generation runs: its end is the daemon's to handle from now on."""
        gen, self._held = self._held, None
        assert gen is not None, "take() or hold() a generation first"
        return gen

    async def close(self) -> None:
        """Stop the ranks of whatever was prepared and never launched."""
        task, self._preparing = self._preparing, None
        if task is not None:
            if self._cancellable and self._stopping.is_set():
                task.cancel()
            await asyncio.wait([task])
            # a preparation that failed (a full disk) left nothing to stop
            if not task.cancelled() and task.exception() is None and (gen := task.result()) is not None:
                await self._launcher.drop(gen)
        held, self._held = self._held, None
        if held is not None:
            await self._launcher.drop(held)
