"""Ask a rank for the Python stacks of all its threads before it is killed.

The in-rank client registers ``faulthandler`` on a signal and announces it. The
dump is written by the signal handler itself (async-signal-safe C, no GIL
needed), straight into the rank's stderr log, so it lands in the rank's own log
even if the daemon is gone a moment later. The daemon reads back what was
appended, bounded in time: a rank stuck in the kernel never answers.

A stopped rank (SIGSTOP, a debugger) is not asked: the signal would wait until it
runs again, and waking it to answer lets it run on while it is judged (it finishes
its collective, its peers go on, and the rank that stopped the job no longer looks
stopped). It is recorded as stopped instead; py-spy reads its Python stacks without
waking it (``supervisor.process.native``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from supervisor.clock import SYSTEM, Clock
from supervisor.process.terminate import Signaller

QUIET = 0.03  # the dump is complete once the log has not grown for this long
MAX_DUMP = 256 * 1024


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


async def dump_stacks(
    pid: int, signum: int, log: Path, timeout: float, *, signals: Signaller | None = None,
    clock: Clock = SYSTEM,
) -> str:  # fmt: skip
    """Signal ``pid`` for a stack dump; return what it appended to ``log`` (nothing
    from a stopped process: it is not woken, see above)."""
    signals = signals or Signaller()
    before = _size(log)
    # stopped by a signal only: a tracing stop (t) may be py-spy's own moment, gathering beside
    if signals.state(pid) == "T" or not signals.process(pid, signum):
        return ""
    return await _read_dump(log, before, timeout, clock)


def stopped(state: str | None) -> bool:
    """A process state letter of a stopped process: by a signal (T) or a debugger (t)."""
    return state in ("T", "t")


async def _read_dump(log: Path, before: int, timeout: float, clock: Clock) -> str:
    deadline = clock.monotonic() + timeout
    size, changed = before, clock.monotonic()
    while clock.monotonic() < deadline:
        await clock.sleep(0.01)
        now_size = _size(log)
        if now_size != size:
            size, changed = now_size, clock.monotonic()
        elif size > before and clock.monotonic() - changed >= QUIET:
            break
    if size <= before:
        return ""
    with contextlib.suppress(OSError), log.open("rb") as f:
        f.seek(before)
        return f.read(min(size - before, MAX_DUMP)).decode(errors="replace")
    return ""


_TICK = os.sysconf("SC_CLK_TCK")


def activity(pid: int) -> tuple[float, int] | None:
    """CPU seconds the process (all its threads) used and bytes it read or wrote so
    far; None when /proc does not say (gone, or not ours to read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/io", "rb") as f:
            io = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        return (int(fields[11]) + int(fields[12])) / _TICK, int(io[b"rchar"]) + int(io[b"wchar"])
    except (OSError, IndexError, KeyError, ValueError):
        return None
