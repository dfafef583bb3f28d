"""The one termination procedure. Restart, abort and shutdown all end ranks here.

1. SIGCONT then the stop signal (SIGTERM) to the process group of every live
   rank: a stopped rank could not act on SIGTERM, and the group holds its
   dataloader workers and other descendants.
2. Wait for them against one shared grace deadline (a force request cuts it short).
3. SIGKILL the groups of the survivors, then sweep (``orphans.sweep_generation``):
   kill the generation's cgroup, which holds everything its ranks started
   whatever it did since; where there is none, every process still carrying the
   generation's token, wherever it moved.
4. Wait ``kill_timeout`` at most for the killed ranks: a rank stuck in the kernel
   (D state) can outlive SIGKILL, and must not wedge the daemon. It is reported.

Only ranks not yet reaped are signalled by pid: a reaped rank's pid may belong
to a stranger by now. Its leftover descendants are the sweep's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from supervisor.clock import SYSTEM, Clock
from supervisor.core.states import RankState
from supervisor.process.spawn import RankProcess

Sweep = Callable[[], Awaitable[int]]


class Signaller:
    """Signal delivery, the procedure's only contact with the OS."""

    def group(self, pgid: int, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)

    def process(self, pid: int, signum: int) -> bool:
        """One process, not its group (a stack dump is the rank's, not its workers'); False
        when it is gone or not ours to signal."""
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def state(self, pid: int) -> str | None:
        """The process's state letter (``T``: stopped), None when it is gone: read before
        anything is sent that could change it."""
        return process_state(pid)


def process_state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, D, T...); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class TerminationReport:
    signalled: tuple[int, ...]  # local ranks alive when the procedure began
    killed: tuple[int, ...]  # those that needed SIGKILL
    unkillable: tuple[int, ...]  # those that outlived SIGKILL and the kill timeout
    swept: int  # descendants found by the sweep (cgroup or token) and killed
    seconds: float


async def _exits(ranks: Sequence[RankProcess], timeout: float, force: asyncio.Event | None) -> None:
    """Return when every rank has exited, ``timeout`` passed, or ``force`` was set."""
    if not ranks:
        return
    waiters = {asyncio.ensure_future(r.proc.wait()) for r in ranks}
    everyone = asyncio.ensure_future(asyncio.wait(waiters))
    forced = asyncio.ensure_future(force.wait()) if force is not None else None
    try:
        await asyncio.wait(
            [everyone] if forced is None else [everyone, forced],
            timeout=max(0.0, timeout),
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        for f in (everyone, forced, *waiters):
            if f is not None:
                f.cancel()


async def terminate(
    ranks: Sequence[RankProcess],
    *,
    grace: float,
    kill_timeout: float,
    force: asyncio.Event | None = None,
    stop_signal: int = signal.SIGTERM,
    signal_for: Mapping[int, int] | None = None,
    sweep: Sweep | None = None,
    signals: Signaller | None = None,
    clock: Clock = SYSTEM,
) -> TerminationReport:
    """``signal_for`` (local rank -> signal) overrides ``stop_signal``: a hung
    rank gets its termination signal (SIGKILL by default) at once."""
    signals = signals or Signaller()
    first = signal_for or {}
    started = clock.monotonic()
    live = [r for r in ranks if r.returncode is None]
    for r in live:
        r.move_to(RankState.STOPPING)
        signals.group(r.pid, signal.SIGCONT)
        signals.group(r.pid, first.get(r.slot.local_rank, stop_signal))
    await _exits(live, grace, force)

    survivors = [r for r in live if r.returncode is None]
    for r in survivors:
        signals.group(r.pid, signal.SIGKILL)
    swept = await sweep() if sweep is not None else 0
    await _exits(survivors, kill_timeout, None)

    unkillable = [r for r in survivors if r.returncode is None]
    for r in unkillable:
        r.move_to(RankState.UNKILLABLE)
    return TerminationReport(
        signalled=tuple(r.slot.local_rank for r in live),
        killed=tuple(r.slot.local_rank for r in survivors),
        unkillable=tuple(r.slot.local_rank for r in unkillable),
        swept=swept,
        seconds=clock.monotonic() - started,
    )
