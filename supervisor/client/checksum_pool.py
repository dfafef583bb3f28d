"""The client's checksum of a slot (``supervisor.core.snapshot_checksum``), its pieces
hashed at once on up to ``workers()`` threads: a background job of the rank's, after its
copy, so that the slot it overwrites next is ready again within a step."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import xxhash

from supervisor.core.snapshot_checksum import PIECE, of_pieces

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

MAX_WORKERS = 8


def workers() -> int:
    """Half the cores this process may run on, at most 8: the node's ranks share them,
    and one thread is what a 2-core machine spares beside training."""
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) // 2))


class _Pool:
    executor: ThreadPoolExecutor | None = None
    pid = 0
    lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    # imported here: every rank imports the client, few snapshot more than a piece
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    with _Pool.lock:
        if _Pool.executor is None or _Pool.pid != os.getpid():  # a forked child starts its own
            _Pool.executor = ThreadPoolExecutor(workers(), thread_name_prefix="ft-checksum-pool")
            _Pool.pid = os.getpid()
        return _Pool.executor


def checksum(buffer: Any, nbytes: int) -> str:
    """The checksum (hex) of the first ``nbytes`` bytes of ``buffer``."""
    with memoryview(buffer) as view, view[:nbytes] as head:
        if nbytes <= PIECE:
            return str(xxhash.xxh3_64_hexdigest(head))
        pieces = [head[at : at + PIECE] for at in range(0, nbytes, PIECE)]
        try:
            several = workers() > 1
            return of_pieces((_executor().map if several else map)(xxhash.xxh3_64_digest, pieces))
        finally:
            for piece in pieces:
                piece.release()
