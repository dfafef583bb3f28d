"""This node's ranks' retained copies: per rank the last two steps its peer acknowledged
(``core.job_snapshots`` says why the job needs them when a replica lags).

The replicator stages a complete slot into a file of the run's directory before it sends
it; once the peer has verified that copy, the staged file becomes the rank's retained
copy (a rename: no byte copied twice), ``retained.rank<R>.<0|1>``, over the one that
arrived first. A step the job agrees on from a retained copy is copied (kernel to kernel)
into one of the rank's own slot files before the rank asks, so it maps it as any other.

Retained copies count against --snapshot-memory and are the first to give way: a rank's
own slot, a replica the peer sends and the next copy to stage take their room, the oldest
step first, told once per reason (``snapshot_retained_dropped``). A copy of a rank this
node no longer runs goes after the agreement that could still have used it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from supervisor.clock import Clock
from supervisor.core.catalogue.snapshots import SnapshotRetainedDropped
from supervisor.core.memory_snapshots import SLOTS, Complete, RankSlots
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.services.held_snapshots import HeldSnapshots


def copy_file(src: str, dst: str, nbytes: int) -> None:
    """The first ``nbytes`` of ``src`` into ``dst``, in the kernel."""
    with open(src, "rb") as s, open(dst, "r+b") as d:
        done = 0
        while done < nbytes:
            n = os.copy_file_range(s.fileno(), d.fileno(), nbytes - done, done, done)
            if n <= 0:
                raise OSError(f"{src} ended after {done} of {nbytes} bytes")
            done += n


def _move(staged: Path, target: Path, nbytes: int) -> None:
    os.truncate(staged, nbytes)  # a stage sized for a larger rank gives the rest back
    staged.replace(target)


class Retained:
    def __init__(self, held: HeldSnapshots, events: EventLog, clock: Clock) -> None:
        self._held, self._events, self._clock = held, events, clock
        self.table: dict[int, RankSlots] = {}
        self.sizes: dict[tuple[int, int], int] = {}
        self._told: set[str] = set()  # reasons of a drop told
        self.kept = 0  # staged copies retained
        self.dropped = 0  # retained copies dropped for room

    @property
    def bytes(self) -> int:
        return sum(self.sizes.values())

    def steps(self) -> dict[int, tuple[int, ...]]:
        return {rank: tuple(sorted(s.steps())) for rank, s in self.table.items() if s.steps()}

    def path_of(self, rank: int, slot: int) -> Path:
        return self._held.directory / f"retained.rank{rank}.{slot}"

    async def keep(self, rank: int, staged: Path, complete: Complete) -> bool:
        """The staged copy of ``complete``, which the peer has verified, becomes the rank's
        retained copy (True: the staging file is gone); False when that step is retained
        already or the file could not be moved (the stage stays as it was). The rename runs
        in a thread: the copy it replaces gives its pages back, 20 ms per 100 MB here."""
        slots = self.table.setdefault(rank, RankSlots())
        if complete.step in slots.steps():
            return False
        free = [slot for slot in SLOTS if slot not in slots.complete]
        slot = free[0] if free else min(slots.complete, key=lambda s: slots.complete[s].at)
        # the copy it replaces is gone from here on: nothing chooses it (a reclaim, a fetch)
        slots.complete.pop(slot, None)
        self.sizes.pop((rank, slot), None)
        try:
            await asyncio.to_thread(_move, staged, self.path_of(rank, slot), complete.nbytes)
        except OSError:
            with contextlib.suppress(OSError):
                self.path_of(rank, slot).unlink()
            return False
        slots.complete[slot] = Complete(complete.step, complete.nbytes, complete.checksum,
                                        self._clock.monotonic())  # fmt: skip
        self.sizes[rank, slot] = complete.nbytes
        self.kept += 1
        return True

    def reclaim(self, need: int, why: str) -> int:
        """Drop retained copies, the oldest step first, until ``need`` bytes are freed (or
        none is left); the bytes freed."""
        freed = 0
        while freed < need:
            held = [(c.step, rank, slot) for rank, s in self.table.items() for slot, c in s.complete.items()]
            if not held:
                break
            _, rank, slot = min(held)
            freed += self._drop(rank, slot, why)
        return freed

    def release(self, running: Collection[int]) -> None:
        """Drop the copies of ranks not in ``running`` (this node runs them no more)."""
        for rank in sorted(set(self.table) - set(running)):
            for slot in list(self.table[rank].complete):
                self._drop(rank, slot, None)
            del self.table[rank]

    def drop(self, steps: Mapping[int, Collection[int]]) -> None:
        """Drop the copies of these steps (rank -> steps): a timeline the job left."""
        for rank, dropped in steps.items():
            for slot, held in list(self.table.get(rank, RankSlots()).complete.items()):
                if held.step in dropped:
                    self._drop(rank, slot, None)

    def _drop(self, rank: int, slot: int, why: str | None) -> int:
        held = self.table[rank].complete.pop(slot)
        size = self.sizes.pop((rank, slot), 0)
        with contextlib.suppress(OSError):
            self.path_of(rank, slot).unlink()
        if why is not None:
            self.dropped += 1
            if why not in self._told:
                self._told.add(why)
                self._events.emit(SnapshotRetainedDropped(rank=rank, step=held.step, bytes=size, why=why))
        return size

    async def restore_into(self, rank: int, step: int) -> None:
        """Copy the rank's retained ``step`` into one of its own slots (the one that does not
        hold its newest step), recorded complete; ValueError when it cannot."""
        found = None if rank not in self.table else self.table[rank].holding(step)
        if found is None:
            raise ValueError(f"no retained copy of rank {rank} step {step}")
        kept, held = found
        slots = self._held.table.get(rank)
        newest = None if slots is None else slots.newest()
        holding = None if slots is None or newest is None else slots.holding(newest.step)
        slot = 0 if holding is None else 1 - holding[0]  # the rank's newest stays as it is
        target = self._held.reserve(rank, slot, held.nbytes)
        if isinstance(target, str):
            raise ValueError(target)  # noqa: TRY004 - a refusal, told as the others are
        await asyncio.to_thread(copy_file, str(self.path_of(rank, kept)), str(target), held.nbytes)
        if not self._held.adopt(rank, slot, held.step, held.nbytes, held.checksum):
            raise ValueError(f"rank {rank}'s slot {slot} could not be recorded")

    def describe(self) -> dict[str, Any]:
        return {"retained": {str(r): list(s) for r, s in self.steps().items()}, "retained_bytes": self.bytes}
