"""The wire between two daemons for snapshot replicas: a header, then the bytes.

A header is four bytes of length (big-endian) and a JSON object of at most
``MAX_HEADER`` bytes; the receiver reads and checks it (``core.job_snapshots.read_offer``)
before it writes anything. The bytes follow in chunks; files are read and written in
the default executor's threads, a chunk at a time, so that a copy of gigabytes never
holds the daemon's loop for more than a chunk's hand-over. Deadlines are
``asyncio.timeout``: Python 3.11's ``wait_for`` can swallow a cancellation that comes as
its awaitable completes, and a copy task that swallowed the daemon's cancel never ended.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import orjson

from supervisor.core.job_snapshots import MAX_HEADER
from supervisor.core.snapshot_checksum import SlotDigest

CHUNK = 1 << 20  # bytes a read or write of a replica moves at once
# a stream's buffer: a few chunks (asyncio's default, 64 KiB, stops and resumes reading
# some thirty times a chunk, which cost a replica of 10 MB ~40 ms of CPU)
STREAM_LIMIT = 4 * CHUNK


class WireError(Exception):
    """The other side broke the protocol, or went away."""


async def send_header(writer: asyncio.StreamWriter, header: dict[str, Any]) -> None:
    body = orjson.dumps(header)
    writer.write(len(body).to_bytes(4, "big") + body)
    await writer.drain()


async def read_header(reader: asyncio.StreamReader, timeout: float) -> dict[str, Any]:
    try:
        async with asyncio.timeout(timeout):
            size = int.from_bytes(await reader.readexactly(4), "big")
        if not 0 < size <= MAX_HEADER:
            raise WireError(f"a header of {size} bytes (at most {MAX_HEADER})")
        async with asyncio.timeout(timeout):
            raw = orjson.loads(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
        raise WireError(f"the other side went away: {type(exc).__name__}") from None
    except ValueError as exc:
        raise WireError(f"an unreadable header: {exc}") from None
    if not isinstance(raw, dict):
        raise WireError("a header is a mapping")
    return raw


def read_chunk(fd: int, offset: int, size: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise OSError(f"{size} bytes expected at {offset}, {len(data)} read")
    return data


def write_chunk(fd: int, offset: int, data: bytes, digest: Any) -> None:
    """Write ``data`` at ``offset`` and fold it into ``digest`` (one thread hop for both)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
    digest.update(data)


async def receive_into(reader: asyncio.StreamReader, fd: int, nbytes: int, timeout: float) -> str:
    """Read ``nbytes`` from the stream into ``fd`` from offset 0; their checksum (hex), the
    client's (``core.snapshot_checksum``)."""
    digest = SlotDigest()
    done = 0
    while done < nbytes:
        want = min(CHUNK, nbytes - done)
        try:
            async with asyncio.timeout(timeout):
                data = await reader.readexactly(want)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
            raise WireError(f"the other side went away after {done} of {nbytes} bytes: "
                            f"{type(exc).__name__}") from None  # fmt: skip
        await asyncio.to_thread(write_chunk, fd, done, data, digest)
        done += want
    return str(digest.hexdigest())
