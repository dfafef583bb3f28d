"""Gather the evidence about a failed rank: its error file and its log's tail."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from supervisor.core.errorfile import parse_error_file
from supervisor.core.types import ErrorRecord, RankExit, RankFailure
from supervisor.process.spawn import RankFiles

TAIL_BYTES = 16 * 1024
TAIL_LINES = 40
AFTER_LINES = 20
ERROR_FILE_LIMIT = 1024 * 1024  # a rank's error file is small; never read a runaway one whole


async def read_error_file(path: Path) -> tuple[ErrorRecord | None, float | None]:
    """The parsed error file and when it was written (mtime), if there is one; read off
    the event loop."""
    return await asyncio.to_thread(read_error_file_now, path)


def read_error_file_now(path: Path) -> tuple[ErrorRecord | None, float | None]:
    """``read_error_file``, blocking; the offline classifier reads with it what the daemon read."""
    try:
        with path.open("rb") as f:
            written = os.fstat(f.fileno()).st_mtime_ns / 1e9
            data = f.read(ERROR_FILE_LIMIT)
    except OSError:
        return None, None
    record = parse_error_file(data.decode(errors="replace"))
    return record, written if record is not None else None


def error_file_time(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns / 1e9
    except OSError:
        return None


def tail_lines(data: bytes, cut: bool, max_lines: int = TAIL_LINES) -> tuple[str, ...]:
    """The last lines of ``data``; ``cut``: it starts mid-file, so its first line is partial."""
    lines = data.decode(errors="replace").splitlines()
    if cut and lines:
        lines = lines[1:]
    return tuple(lines[-max_lines:])


async def log_tail(
    path: Path,
    max_bytes: int = TAIL_BYTES,
    max_lines: int = TAIL_LINES,
    *,
    start: int = 0,
    end: int | None = None,
) -> tuple[str, ...]:
    """The last lines of ``path`` between byte ``start`` and ``end`` (None: its end), read
    off the event loop (a log on a hung mount must not stall it)."""
    return await asyncio.to_thread(read_tail, path, max_bytes, max_lines, start=start, end=end)


def read_tail(
    path: Path,
    max_bytes: int = TAIL_BYTES,
    max_lines: int = TAIL_LINES,
    *,
    start: int = 0,
    end: int | None = None,
) -> tuple[str, ...]:
    """``log_tail``, blocking; the offline classifier reads with it what the daemon read."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            stop = size if end is None else min(end, size)
            first = max(start, stop - max_bytes)
            f.seek(first)
            data = f.read(stop - first)
    except OSError:
        return ()
    return tail_lines(data, first > start, max_lines)


async def failure_evidence(exit: RankExit, files: RankFiles, exit_offset: int | None = None) -> RankFailure:
    """``exit_offset``: how far its stderr log went when the rank died. Lines after it were
    written by processes it left behind (forked workers): kept apart as ``after_exit``."""
    error, error_at = await read_error_file(files.error_file)
    tail = await log_tail(files.stderr, end=exit_offset)
    after = await log_tail(files.stderr, max_lines=AFTER_LINES, start=exit_offset) if exit_offset else ()
    return RankFailure(exit=exit, error=error, error_at=error_at, log_tail=tail, after_exit=after)
