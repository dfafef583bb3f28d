"""Replicas this daemon keeps of another node's ranks, and the endpoint that takes them
and serves them back.

The previous node in the job's order sends its ranks' complete snapshots here
(``replicator``); a new daemon on that node, which lost them, asks them back at the start
of a generation (``job_snapshots``). Per replicated rank two files in the run's shared-
memory directory, ``replica.rank<R>.<slot>``, within the same --snapshot-memory budget
as the ranks' own slots. A replica goes into the slot that does not hold the newest
complete one, so a copy cut off never costs the newest; it is complete only when the
bytes match the checksum the header gave (the rank's own, recorded by its daemon).

Within the budget: a replica that does not fit takes the room of this node's retained
copies (``retained``), never of its ranks' slots or of another replica; failing that it is
refused, told once per rank. A replica smaller than its file gives the rest back, and the
replicas of ranks the previous node no longer runs are released after each agreement
(``release``). Each header carries the sender's stride: a wider one widens this node's.

The endpoint listens on the node's address (the one its peers reach it by), on a port
the kernel picks, and publishes ``host:port`` and a token through the rendezvous store:
a header without the token is refused before anything is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import Callable, Collection, Mapping
from typing import Any

from supervisor.clock import Clock
from supervisor.core.catalogue.snapshots import SnapshotReplicaRejected, SnapshotReplicasReleased
from supervisor.core.job_snapshots import Offer, read_offer
from supervisor.core.memory_snapshots import Complete, RankSlots
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.services.held_snapshots import HeldSnapshots
from supervisor.runtime.services.retained import Retained
from supervisor.runtime.services.snapshot_wire import (
    CHUNK,
    STREAM_LIMIT,
    WireError,
    read_chunk,
    read_header,
    receive_into,
    send_header,
)

IDLE = 600.0  # seconds a sender's connection may wait between two replicas
CHUNK_TIMEOUT = 30.0  # seconds a chunk of a replica in flight may take
GEN = 0  # replicas have no generation of this daemon's: one for RankSlots' bookkeeping


class Replicas:
    def __init__(self, held: HeldSnapshots, events: EventLog, clock: Clock, *, host: str,
                 retained: Retained | None = None) -> None:  # fmt: skip
        self._held, self._events, self._clock, self._host = held, events, clock, host
        self.retained = Retained(held, events, clock) if retained is None else retained
        self.on_stride: Callable[[int, str], None] = lambda stride, why: None  # a sender's wider grid
        self.token = secrets.token_hex(16)
        self.table: dict[int, RankSlots] = {}
        self.sizes: dict[tuple[int, int], int] = {}
        self.endpoint: str | None = None
        self._server: asyncio.Server | None = None
        self._told: set[str] = set()  # reasons of refusal told
        self._writers: set[asyncio.StreamWriter] = set()  # connections open now
        self.taken = 0  # replicas kept complete
        self.served = 0  # replicas served back

    @property
    def bytes(self) -> int:
        return sum(self.sizes.values())

    def steps(self) -> dict[int, tuple[int, ...]]:
        return {rank: tuple(sorted(s.steps())) for rank, s in self.table.items() if s.steps()}

    def path_of(self, rank: int, slot: int) -> Any:
        return self._held.directory / f"replica.rank{rank}.{slot}"

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, self._host, 0, limit=STREAM_LIMIT)
        port = self._server.sockets[0].getsockname()[1]
        host = f"[{self._host}]" if ":" in self._host else self._host
        self.endpoint = f"{host}:{port}"
        return self.endpoint

    def close(self) -> None:
        """Stop listening, and end the copies in flight: at once, nothing awaited (this runs
        while the daemon's tasks are cancelled, on its way out)."""
        for writer in list(self._writers):  # a copy in flight ends with the daemon
            writer.transport.abort()
        if self._server is not None:
            self._server.close()
            self._server = None

    def forget(self) -> None:
        """The run's directory is gone (released): so are the replicas."""
        self.table, self.sizes = {}, {}

    def drop(self, steps: Mapping[int, Collection[int]]) -> None:
        """Drop the replicas of these steps (rank -> steps), their files with them."""
        for rank, dropped in steps.items():
            slots = self.table.get(rank, RankSlots())
            for slot, held in list(slots.complete.items()):
                if held.step in dropped:
                    del slots.complete[slot]
                    self.sizes.pop((rank, slot), None)
                    with contextlib.suppress(OSError):
                        self.path_of(rank, slot).unlink()

    def release(self, ranks: Collection[int], generation: int | None, why: str) -> None:
        """Drop the replicas of ``ranks`` and give their memory back (one event)."""
        gone = sorted(set(ranks) & set(self.table))
        freed = 0
        for rank in gone:
            del self.table[rank]
            for slot in (0, 1):
                freed += self.sizes.pop((rank, slot), 0)
                with contextlib.suppress(OSError):
                    self.path_of(rank, slot).unlink()
        if gone:
            released = SnapshotReplicasReleased(generation=generation, ranks=gone, bytes=freed, why=why)
            self._events.emit(released)

    # -- one connection: replicas offered, one after the other, or a fetch ---------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    raw = await read_header(reader, IDLE)
                except WireError:
                    return  # the sender closed between two replicas, or went away
                # the room itself is _take's: it knows the file the replica replaces
                offer = read_offer(raw, self.token, limit=self._held.budget)
                if isinstance(offer, str):
                    self._reject(raw, offer, "room" if "room" in offer else None)
                    await send_header(writer, {"ok": False, "why": offer})
                    return
                if offer.kind == "fetch":
                    await self._give(offer, writer)
                elif not await self._take(offer, reader, writer):
                    return
        except (ConnectionError, WireError, OSError) as exc:
            self._reject({}, f"the sender went away: {exc}")
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _take(self, offer: Offer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Keep one replica; False when the connection cannot go on."""
        if offer.stride > 1:
            self.on_stride(offer.stride, f"node {offer.node} replicates every {offer.stride} steps")
        slots = self.table.setdefault(offer.rank, RankSlots())
        if offer.step in slots.steps():
            await send_header(writer, {"ok": True, "have": True})
            return True
        # the slot that does not hold the latest kept (by arrival, not step: a job that went
        # back to an older step from disk sends older steps, and they must cycle)
        latest = max(slots.complete.items(), key=lambda kv: kv[1].at, default=None)
        slot = 0 if latest is None else 1 - latest[0]
        have = self.sizes.get((offer.rank, slot), 0)
        if offer.nbytes > have:
            why = self._no_room(offer, offer.nbytes - have)
            if why is not None:
                self._reject(offer, why, "room")
                await send_header(writer, {"ok": False, "why": why})
                return True  # the sender may offer a smaller one later
        if offer.nbytes != have:  # grown, or shrunk: a smaller replica gives the rest back
            self._held.grow(self.path_of(offer.rank, slot), offer.nbytes)
            self.sizes[offer.rank, slot] = offer.nbytes
        slots.begin(slot, GEN, self._clock.monotonic())  # incomplete from here
        await send_header(writer, {"ok": True})
        fd = os.open(self.path_of(offer.rank, slot), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            digest = await receive_into(reader, fd, offer.nbytes, CHUNK_TIMEOUT)
        except WireError as exc:
            self._reject(offer, str(exc))
            return False
        finally:
            os.close(fd)
        if digest != offer.checksum:
            why = f"bytes whose checksum is {digest}, not the {offer.checksum} the header gave"
            self._reject(offer, why)
            await send_header(writer, {"ok": False, "why": why})
            return True
        size, now = self.sizes[offer.rank, slot], self._clock.monotonic()
        slots.done(slot, GEN, offer.step, offer.nbytes, offer.checksum, size=size, now=now)
        self.taken += 1
        await send_header(writer, {"ok": True})
        return True

    def _no_room(self, offer: Offer, more: int) -> str | None:
        """Why ``more`` bytes for ``offer`` do not fit the budget (after this node's retained
        copies gave theirs), or None when they do. The node's own slots are never touched."""
        over = self._held.total + more - self._held.budget
        if over > 0:
            self.retained.reclaim(over, "a peer's replica needed the room")
        if self._held.total + more <= self._held.budget:
            return None
        return (f"no room for rank {offer.rank}'s replica of step {offer.step} ({offer.nbytes} bytes): "
                f"{self._held.total} of --snapshot-memory {self._held.budget} held, {self.bytes} by "
                f"replicas; the node's own ranks' snapshots come first")  # fmt: skip

    async def _give(self, offer: Offer, writer: asyncio.StreamWriter) -> None:
        """A replica back, or a slot or retained copy of a rank this node ran before the job's
        order changed (none of this generation's ranks writes it)."""
        path, found = self.path_of, self._holding(self.table, offer)
        if found is None:
            path, found = self._held.path, self._holding(self._held.table, offer)
        if found is None:
            path, found = self.retained.path_of, self._holding(self.retained.table, offer)
        if found is None:
            why = f"no replica of rank {offer.rank} step {offer.step}"
            await send_header(writer, {"ok": False, "why": why})
            return
        slot, held = found
        answer = {"ok": True, "step": held.step, "bytes": held.nbytes, "checksum": held.checksum}
        await send_header(writer, answer)
        fd = os.open(path(offer.rank, slot), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            for offset in range(0, held.nbytes, CHUNK):
                size = min(CHUNK, held.nbytes - offset)
                writer.write(await asyncio.to_thread(read_chunk, fd, offset, size))
                await writer.drain()
        finally:
            os.close(fd)
        self.served += 1

    @staticmethod
    def _holding(table: dict[int, RankSlots], offer: Offer) -> tuple[int, Complete] | None:
        slots = table.get(offer.rank)
        return None if slots is None else slots.holding(offer.step)

    def _reject(self, offer: Offer | dict[str, Any], why: str, kind: str | None = None) -> None:
        """Tell a refusal once per reason (``kind``: once per kind and rank, whatever the numbers)."""
        rank = offer.get("rank") if isinstance(offer, dict) else offer.rank
        reason = why.split(":", maxsplit=1)[0][:60] if kind is None else f"{kind} {rank!r:.20}"
        if reason in self._told:
            return
        self._told.add(reason)
        raw = (
            offer if isinstance(offer, dict) else {"node": offer.node, "rank": offer.rank, "step": offer.step}
        )
        node, rank, step = (
            v if type(v) is int else None for v in (raw.get(k) for k in ("node", "rank", "step"))
        )
        self._events.emit(SnapshotReplicaRejected(node=node, rank=rank, step=step, why=why))
