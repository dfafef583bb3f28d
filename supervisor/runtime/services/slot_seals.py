"""What the daemon reads of a slot file whose rank died before its done: the header's seal
(``core.memory_snapshots.sealed``: the client writes it last, once its copy is whole) and a
checksum of the sealed length, the client's own (``core.snapshot_checksum``). Blocking: called in a thread."""

from __future__ import annotations

import os
from pathlib import Path

from supervisor.core.memory_snapshots import HEADER_SIZE, sealed
from supervisor.core.snapshot_checksum import SlotDigest

CHUNK = 8 << 20  # bytes read at a time


def read_sealed(path: Path, size: int) -> tuple[int, int, str] | None:
    """A slot file's sealed step and length, and the checksum of that length (the client's);
    None when its copy was not sealed or does not fit ``size``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        found = sealed(os.pread(fd, HEADER_SIZE, 0))
        if found is None or found[1] > size:
            return None
        step, nbytes = found
        digest, left, at = SlotDigest(), nbytes, 0
        while left > 0:
            chunk = os.pread(fd, min(left, CHUNK), at)
            if not chunk:
                return None  # shorter than sealed
            digest.update(chunk)
            left, at = left - len(chunk), at + len(chunk)
        return step, nbytes, digest.hexdigest()
    finally:
        os.close(fd)
