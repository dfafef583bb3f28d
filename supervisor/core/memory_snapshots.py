"""Training state held in memory for the ranks: which step a restore may use, and each
rank's two slots.

A rank writes its snapshot into one of two slots (0, 1), alternately, so that a copy
cut off by its death never damages the newest complete one. A slot is complete only
once the rank said so (``done``) after the daemon had marked it as being written
(``begin``) in the same generation: a begin of a rank that died before its done leaves
the slot incomplete for good (until it is begun again).

A restore uses the newest step that every rank holds complete (``common_step``): ranks
never mix steps. The function takes one set of steps per rank, whichever daemon holds
them, so that a job-wide agreement (other nodes' sets, through the store) is the same
call with more entries.

A rank killed after its copy but before its done (the checksum and the message go from
a background thread) leaves a slot whose bytes are whole but unrecorded: in DDP its peers
may then hold the next step and overwrite the older one, and no step is common. So the
rank seals the slot's header once its copy is done (``SEAL``: the step plus one, and the
bytes written; zero while it writes), and the daemon, once the rank is gone, records a
sealed slot of its last begin as complete, with a checksum of its own. The header is the
only part of a slot file the daemon reads; the rest is the client's
(``client.snapshot_slots``).

Pure: no clock, no files; the daemon's service (``runtime.services.held_snapshots``)
owns the files and the time.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

SLOTS = (0, 1)
MAGIC = b"FTSNAP01"
HEADER = struct.Struct("<8sQQQ")  # magic, skeleton length, data offset, step
SEAL = struct.Struct("<QQ")  # step + 1 (0: being written), bytes written; after HEADER
HEADER_SIZE = 64


def sealed(header: bytes) -> tuple[int, int] | None:
    """The step and the bytes a slot's header says were copied whole, or None (not a slot
    header, or its copy was cut off)."""
    if len(header) < HEADER.size + SEAL.size:
        return None
    magic, _length, _offset, step = HEADER.unpack_from(header, 0)
    plus_one, nbytes = SEAL.unpack_from(header, HEADER.size)
    if magic != MAGIC or plus_one != step + 1 or nbytes < HEADER_SIZE:
        return None
    return step, nbytes


def common_step(held: Mapping[int, Collection[int]]) -> int | None:
    """The newest step every rank of ``held`` (rank -> its complete steps) holds; None
    when there is no rank, a rank holds nothing, or no step is held by all."""
    common: set[int] | None = None
    for steps in held.values():
        common = set(steps) if common is None else common.intersection(steps)
        if not common:
            return None
    return max(common) if common else None


@dataclass(frozen=True, slots=True)
class Complete:
    """A complete slot: the step it holds, its length and the checksum of that length."""

    step: int
    nbytes: int
    checksum: str
    at: float  # when (the daemon's monotonic clock) the rank said it was done


@dataclass(slots=True)
class RankSlots:
    """One rank's two slots: those complete, and those being written (by generation)."""

    complete: dict[int, Complete] = field(default_factory=dict)
    writing: dict[int, tuple[int, float]] = field(default_factory=dict)  # slot -> (generation, since)

    def begin(self, slot: int, generation: int, now: float) -> None:
        """The rank is about to overwrite ``slot``: whatever it held is no longer complete."""
        self.complete.pop(slot, None)
        self.writing[slot] = (generation, now)

    def done(
        self, slot: int, generation: int, step: int, nbytes: int, checksum: str, *, size: int, now: float
    ) -> float | None:
        """Record ``slot`` complete when it was begun in this generation and ``nbytes`` fits
        the slot's ``size``; the seconds since its begin, or None when it is not recorded."""
        begun = self.writing.get(slot)
        if begun is None or begun[0] != generation or not 0 < nbytes <= size:
            return None
        del self.writing[slot]
        self.complete[slot] = Complete(step, nbytes, checksum, now)
        return now - begun[1]

    def unfinished(self, before: int) -> list[int]:
        """Slots a rank of a generation before ``before`` (its ranks are gone) began and never
        said done. Not those the daemon fills itself from a peer (generation -1): a fetch cut
        short has a whole header, sealed by the rank that wrote it, before the rest of it."""
        return sorted(slot for slot, (generation, _) in self.writing.items() if 0 <= generation < before)

    def seal(self, slot: int, step: int, nbytes: int, checksum: str, *, size: int, now: float) -> bool:
        """Record an unfinished ``slot`` complete from its header's seal (``sealed``) and the
        checksum the daemon took of it; False when ``nbytes`` does not fit the slot."""
        if slot not in self.writing or not HEADER_SIZE <= nbytes <= size:
            return False
        del self.writing[slot]
        self.complete[slot] = Complete(step, nbytes, checksum, now)
        return True

    def steps(self) -> set[int]:
        return {c.step for c in self.complete.values()}

    def holding(self, step: int) -> tuple[int, Complete] | None:
        """The slot that holds ``step`` complete, and what it holds."""
        for slot in sorted(self.complete):
            if self.complete[slot].step == step:
                return slot, self.complete[slot]
        return None

    def newest(self) -> Complete | None:
        return max(self.complete.values(), key=lambda c: c.step, default=None)


def held_steps(table: Mapping[int, RankSlots], ranks: Collection[int]) -> dict[int, set[int]]:
    """``common_step``'s input for ``ranks`` (a rank the table lacks holds nothing)."""
    return {rank: table[rank].steps() if rank in table else set() for rank in ranks}
