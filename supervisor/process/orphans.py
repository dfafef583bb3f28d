"""The daemon's side of orphan cleanup: the sentinel process and token sweeps."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from supervisor.process import sentinel

T = TypeVar("T")

SENTINEL = str(Path(sentinel.__file__))


async def off_loop(fn: Callable[[], T], timeout: float) -> T:
    """Run ``fn`` in a daemon thread; give up waiting after ``timeout``.

    Not the default executor: a /proc read can hang on a process wedged in the
    kernel, and asyncio waits for executor threads at exit; a daemon thread is
    simply abandoned.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result, error = fn(), None
        except BaseException as exc:
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop may be closed by now
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name="off-loop", daemon=True).start()
    return await asyncio.wait_for(future, timeout)


class OrphanGuard:
    """Holds the sentinel's pipe; while the daemon lives, the sentinel waits."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    @classmethod
    async def start(cls, run_entry: bytes) -> OrphanGuard:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",
            SENTINEL,
            run_entry.decode(),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            # its own session: a Ctrl-C in the terminal is for the daemon alone
            start_new_session=True,
        )
        return cls(proc)

    @property
    def pid(self) -> int:
        return self._proc.pid

    async def close(self, timeout: float = 5.0) -> None:
        """Normal exit: the sentinel sweeps once more (finding nothing) and exits."""
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            await asyncio.wait_for(self._proc.wait(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()


async def sweep_generation(entry: bytes, timeout: float = 5.0) -> int:
    """SIGKILL every descendant of a generation, wherever it moved. Bounded."""
    try:
        return await off_loop(lambda: sentinel.sweep(entry, prefix=False), timeout)
    except TimeoutError:
        return 0
