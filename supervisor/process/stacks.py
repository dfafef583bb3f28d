"""Ask a rank for the Python stacks of all its threads before it is killed.

The in-rank client registers ``faulthandler`` on a signal and announces it. The
dump is written by the signal handler itself (async-signal-safe C, no GIL
needed), straight into the rank's stderr log, so it lands in the rank's own log
even if the daemon is gone a moment later. A stopped rank gets SIGCONT, or the
signal would wait. The daemon reads back what was appended, bounded in time: a
rank stuck in the kernel never answers.
"""

from __future__ import annotations

import contextlib
import os
import signal
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
    """Signal ``pid`` for a stack dump; return what it appended to ``log``.

    A stopped rank is stopped again once it has answered: resumed, it would go on
    training, and what it then wrote (its peer's connection reset as we stop the
    peer) would read as a new failure of its own."""
    signals = signals or Signaller()
    before = _size(log)
    stopped = process_state(pid) == "T"
    if not signals.process(pid, signum) or not signals.process(pid, signal.SIGCONT):
        return ""
    try:
        return await _read_dump(log, before, timeout, clock)
    finally:
        if stopped:
            signals.process(pid, signal.SIGSTOP)


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


def process_state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, D, T...); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


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
