"""The daemon's side of orphan cleanup: the sentinel process, and the sweep that
ends a generation's descendants (its cgroup, or where it has none its token)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TypeVar

from supervisor.process import cgroups, sentinel
from supervisor.process.spawn import RankProcess

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
        """The sentinel also gets the run's cgroup (``cgroups.run_cgroup``), which may
        not exist yet, or ever: it kills and removes whatever is there when it acts."""
        where = cgroups.run_cgroup(run_entry)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",
            SENTINEL,
            run_entry.decode(),
            *([str(where)] if isinstance(where, Path) else []),
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


def _cgroups(ranks: Collection[RankProcess]) -> list[Path]:
    return sorted({r.containment.cgroup for r in ranks if r.containment.cgroup is not None})


async def sweep_generation(entry: bytes, ranks: Collection[RankProcess] = (), timeout: float = 5.0) -> int:
    """SIGKILL every descendant of a generation, wherever it moved; how many it found
    (in a cgroup, the ranks themselves are not counted). Bounded.

    The generation's cgroup holds everything its ranks started, whatever became of
    its environment; only ranks in no cgroup need the token sweep (which misses a
    process that dropped its environment, and reads all of /proc to find the rest).
    """
    own = {r.pid for r in ranks}
    paths = _cgroups(ranks)
    by_token = not ranks or any(r.containment.cgroup is None for r in ranks)

    def sweep() -> int:
        killed = sum(1 for path in paths for pid in sentinel.kill_cgroup(str(path)) if pid not in own)
        if by_token:
            killed += sentinel.sweep(entry, prefix=False)
        return killed

    try:
        return await off_loop(sweep, timeout)
    except TimeoutError:
        return 0


async def release_generation(ranks: Collection[RankProcess], timeout: float = 5.0) -> dict[str, list[int]]:
    """Remove the generation's cgroup once it is empty; for each one that is not
    within ``timeout`` (a process that outlived SIGKILL), the pids still in it."""

    def release() -> dict[str, list[int]]:
        busy = {}
        for path in _cgroups(ranks):
            if not sentinel.remove_cgroup(str(path), timeout):
                busy[str(path)] = sentinel.cgroup_pids(str(path))
        return busy

    try:
        return await off_loop(release, timeout + 1.0)
    except TimeoutError:
        return {str(path): [] for path in _cgroups(ranks)}
