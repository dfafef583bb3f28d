"""A slot's checksum (supervisor/core/snapshot_checksum.py) is one value wherever it is
taken: the client's over several threads, the daemon's fed a chunk at a time from a file
or a stream; xxh3_64 of the bytes up to a piece, of the pieces' digests beyond."""

from __future__ import annotations

import os

import pytest
import xxhash

from supervisor.client import checksum_pool
from supervisor.core import snapshot_checksum
from supervisor.core.snapshot_checksum import SlotDigest

PIECE = 4096  # the pieces made small, so every boundary is cheap to reach


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot_checksum, "PIECE", PIECE)
    monkeypatch.setattr(checksum_pool, "PIECE", PIECE)


def fed(data: bytes, chunk: int) -> str:
    digest = SlotDigest()
    for at in range(0, len(data), chunk):
        digest.update(data[at : at + chunk])
    return digest.hexdigest()


@pytest.mark.parametrize("size", [1, PIECE - 1, PIECE, PIECE + 1, 3 * PIECE, 3 * PIECE + 17])
@pytest.mark.parametrize("threads", [1, 4])
def test_the_client_and_the_daemon_agree(size: int, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checksum_pool, "workers", lambda: threads)
    data = os.urandom(size) + b"beyond"  # what follows the recorded length is not hashed
    client = checksum_pool.checksum(data, size)
    assert all(fed(data[:size], chunk) == client for chunk in (1000, PIECE, 5 * PIECE))
    if size <= PIECE:  # one piece: plain xxh3_64, as every slot until now
        assert client == xxhash.xxh3_64_hexdigest(data[:size])
    else:
        pieces = [xxhash.xxh3_64_digest(data[at : min(at + PIECE, size)]) for at in range(0, size, PIECE)]
        assert client == xxhash.xxh3_64_hexdigest(b"".join(pieces))


def test_a_damaged_piece_changes_it() -> None:
    data = bytearray(os.urandom(3 * PIECE))
    before = checksum_pool.checksum(data, len(data))
    data[2 * PIECE + 5] ^= 1
    assert checksum_pool.checksum(data, len(data)) != before


def test_half_the_cores_at_most_eight() -> None:
    assert checksum_pool.workers() == max(1, min(8, len(os.sched_getaffinity(0)) // 2))
