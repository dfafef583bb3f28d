"""Gather the evidence about a failed rank: its error file and its log's tail."""

from __future__ import annotations

import os
from pathlib import Path

import aiofiles

from supervisor.core.errorfile import parse_error_file
from supervisor.core.types import ErrorRecord, RankExit, RankFailure
from supervisor.process.spawn import RankFiles

TAIL_BYTES = 16 * 1024
TAIL_LINES = 40
ERROR_FILE_LIMIT = 1024 * 1024  # a rank's error file is small; never read a runaway one whole


async def read_error_file(path: Path) -> tuple[ErrorRecord | None, float | None]:
    """The parsed error file and when it was written (mtime), if there is one."""
    try:
        async with aiofiles.open(path, "rb") as f:
            written = os.fstat(f.fileno()).st_mtime_ns / 1e9
            data = await f.read(ERROR_FILE_LIMIT)
    except OSError:
        return None, None
    record = parse_error_file(data.decode(errors="replace"))
    return record, written if record is not None else None


def error_file_time(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns / 1e9
    except OSError:
        return None


async def log_tail(path: Path, max_bytes: int = TAIL_BYTES, max_lines: int = TAIL_LINES) -> tuple[str, ...]:
    try:
        async with aiofiles.open(path, "rb") as f:
            size = await f.seek(0, os.SEEK_END)
            await f.seek(max(0, size - max_bytes))
            data = await f.read(max_bytes)
    except OSError:
        return ()
    lines = data.decode(errors="replace").splitlines()
    if len(data) == max_bytes and size > max_bytes:
        lines = lines[1:]  # the first line is cut
    return tuple(lines[-max_lines:])


async def failure_evidence(exit: RankExit, files: RankFiles) -> RankFailure:
    error, error_at = await read_error_file(files.error_file)
    return RankFailure(exit=exit, error=error, error_at=error_at, log_tail=await log_tail(files.stderr))
