"""The checksum of a snapshot's slot, the same wherever it is taken: by the rank's client
after its copy (over several cores: ``supervisor.client.checksum_pool``), by the daemon
reading a slot whose rank died before its done, by the daemon receiving a peer's replica.

Up to ``PIECE`` bytes it is xxh3_64 (hex) of the bytes. Beyond, it is xxh3_64 of the
pieces' xxh3_64 digests (8 bytes each, in order): one thread hashes memory at about
10 GB/s, so the checksum of a billion parameters' state (12 GB) took 1.3 s, longer than a
step; pieces can be hashed at once on the node's idle cores (xxhash releases the GIL).
"""

from __future__ import annotations

from collections.abc import Iterable

import xxhash

PIECE = 64 << 20  # bytes of one piece


def of_pieces(digests: Iterable[bytes]) -> str:
    """The checksum of more than one piece, from their digests in order."""
    outer = xxhash.xxh3_64()
    for digest in digests:
        outer.update(digest)
    return outer.hexdigest()


class SlotDigest:
    """The checksum fed in order, a chunk at a time (a file read, a stream): ``update`` and
    ``hexdigest`` as a hashlib object."""

    def __init__(self) -> None:
        self._piece = xxhash.xxh3_64()
        self._filled = 0  # bytes in the current piece
        self._done: list[bytes] = []  # the digests of the pieces before it

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            if self._filled == PIECE:  # more after a whole piece: it is one of several
                self._done.append(self._piece.digest())
                self._piece.reset()
                self._filled = 0
            take = min(len(view), PIECE - self._filled)
            self._piece.update(view[:take])
            self._filled += take
            view = view[take:]

    def hexdigest(self) -> str:
        if not self._done:
            return self._piece.hexdigest()
        return of_pieces([*self._done, self._piece.digest()])
