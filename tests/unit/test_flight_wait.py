"""The daemon's wait for a rank's Flight Recorder dump (supervisor/process/native.py) ends
when the rank exits: a rank going down writes none, and a job's verdict waited the whole
bound for it (10 s in a size-desync trial of scripts/bench/blame.py)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from supervisor.core.flight import OWN_PIPE_SUFFIX
from supervisor.process.native import DUMP_ENV, PIPE_ENV, flight_recorder

BOUND = 5.0


def _asked(tmp_path: Path) -> tuple[dict[str, str], int]:
    """A rank's own dump pipe with a reader (the rank's client), as the rank makes it."""
    pipe = tmp_path / f"pipe0{OWN_PIPE_SUFFIX}"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    return {PIPE_ENV: str(tmp_path / "pipe"), DUMP_ENV: str(tmp_path / "dump")}, reader


def test_a_rank_that_exits_is_not_waited_for(tmp_path: Path) -> None:
    env, reader = _asked(tmp_path)
    try:
        began = time.monotonic()
        path, why = asyncio.run(flight_recorder(env, 0, BOUND, alive=lambda: False))
        assert path is None and why is not None and "exited" in why, why
        assert time.monotonic() - began < BOUND / 2
    finally:
        os.close(reader)


def test_a_live_rank_is_waited_for_until_its_dump_is_whole(tmp_path: Path) -> None:
    env, reader = _asked(tmp_path)

    async def answer() -> tuple[Path | None, str | None]:
        asking = asyncio.ensure_future(flight_recorder(env, 0, BOUND))
        while True:  # the daemon's request reaches the rank's pipe
            try:
                if os.read(reader, 1) == b"1":
                    break
            except BlockingIOError:
                pass
            await asyncio.sleep(0.01)
        part = tmp_path / "dump0.part"
        part.write_bytes(b"a dump")
        part.rename(tmp_path / "dump0")  # the client renames its dump into place whole
        return await asking

    try:
        path, why = asyncio.run(answer())
        assert (path, why) == (tmp_path / "dump0", None)
    finally:
        os.close(reader)
