"""This node's ranks' complete snapshots, sent to the next node's daemon.

Each complete slot (``HeldSnapshots.on_complete``) replaces whatever of that rank waits
to be sent (newest wins: the queue holds one snapshot a rank, the newest); the copy in
flight goes on, or a step shorter than a copy would never let one land. One at a time,
the rank that waited longest first:

1. staged: the slot is copied (kernel to kernel, ``copy_file_range``, in a thread) into
   one staging file of the run's directory, within --snapshot-memory, because the rank
   overwrites a slot two snapshots later and a copy bounded in bandwidth takes longer;
   when the rank began that slot again during the copy the staged bytes may be torn and
   are dropped (a newer snapshot is on its way);
2. sent: a header (the receiver's token, the job, this node, rank, step, bytes, checksum),
   the receiver's go, the bytes in chunks paced to --snapshot-replication-rate, and the
   receiver's verdict (its checksum of what it wrote).

The peer is chosen by the job's agreement each generation (``target``); one that vanishes
or refuses is told once, and nothing more goes to it until the next agreement.

Only steps on the job's grid are sent (``core.job_snapshots.on_grid``: all of them while
the copies keep up). Once the peer verified a copy, the staged file becomes the rank's
retained copy (``retained``) and the next copy stages afresh; a copy that ended a stride
or more behind widens the stride, and so does a wider one in a peer's header (``widen``).
Each header carries the stride, so the nodes converge; each agreement sets the stride the
nodes' recent copies needed (``need``, ``settle``), narrower again after a slow spell.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.clock import Clock
from supervisor.core.catalogue.snapshots import (
    SnapshotReplicated,
    SnapshotReplicationFailed,
    SnapshotStrideChanged,
)
from supervisor.core.job_snapshots import needed_stride, on_grid, pause, stride_for
from supervisor.core.memory_snapshots import Complete
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.services.held_snapshots import TAKEN_EVERY, HeldSnapshots
from supervisor.runtime.services.retained import Retained, copy_file
from supervisor.runtime.services.snapshot_wire import CHUNK, read_chunk, read_header, send_header

CONNECT_TIMEOUT = 5.0
ANSWER_TIMEOUT = 30.0  # seconds the receiver may take to say go, or to verify what it wrote
STAGE = "stage"  # the staging file's name in the run's directory
LAGS = 16  # copies whose lag says which stride the next agreement needs


@dataclass(frozen=True, slots=True)
class Peer:
    node: int
    host: str
    port: int
    token: str


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


class Replicator:
    def __init__(self, held: HeldSnapshots, events: EventLog, clock: Clock, *, rate: int, job: str,
                 node_rank: int = 0, retained: Retained | None = None) -> None:  # fmt: skip
        self._held, self._events, self._clock = held, events, clock
        self.retained = Retained(held, events, clock) if retained is None else retained
        self.stride = 1  # the job's grid: only its steps are sent (narrowed at an agreement only)
        self._lags: deque[int] = deque(maxlen=LAGS)  # steps behind, at the last copies' verdicts
        self.rate, self.job, self.node_rank = rate, job, node_rank
        self.generation: int | None = None
        self.peer: Peer | None = None
        self._pending: dict[int, tuple[int, Complete]] = {}  # rank -> (slot, what it held)
        self._wake = asyncio.Event()
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.replicated: dict[int, Complete] = {}  # rank -> the newest the peer keeps
        self.stage_bytes = 0
        self._told: dict[int, tuple[int | None, float]] = {}  # rank -> (generation, when) told
        self._failed = False  # the peer failed: nothing goes to it until the next target
        self.torn = 0  # staged copies dropped: the rank began the slot again meanwhile
        self._sendfile = True  # until the loop says it cannot

    def offer(self, rank: int, slot: int) -> None:
        """A slot just completed (``HeldSnapshots.on_complete``): the newest to send."""
        slots = self._held.table.get(rank)
        complete = None if slots is None else slots.complete.get(slot)
        if self.rate > 0 and complete is not None and on_grid(complete.step, self.stride):
            self._pending[rank] = (slot, complete)
            self._wake.set()

    @property
    def waiting(self) -> dict[int, int]:
        """rank -> the step waiting to be sent."""
        return {rank: complete.step for rank, (_, complete) in self._pending.items()}

    @property
    def need(self) -> int:
        """The stride this node's recent copies needed (what it publishes at an agreement)."""
        return needed_stride(self._lags)

    def widen(self, stride: int, why: str, lag: int | None = None) -> None:
        """Send every ``stride``-th step from now, when wider than today's grid."""
        if stride > self.stride:
            self.settle(stride, why, lag)

    def settle(self, stride: int, why: str, lag: int | None = None) -> None:
        """Send every ``stride``-th step from now (the job's agreement: narrower too)."""
        if stride != self.stride:
            self.stride = stride
            self._events.emit(SnapshotStrideChanged(generation=self.generation, stride=stride, lag_steps=lag,
                                                    why=why))  # fmt: skip

    def target(self, peer: Peer | None, generation: int, node_rank: int) -> None:
        """The peer the job chose for this generation (None: no replication now)."""
        self.generation, self.node_rank = generation, node_rank
        if peer != self.peer:
            self._close()
        self.peer, self._failed = peer, False
        self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._pending and self.peer is not None and not self._failed:
                    rank = min(self._pending, key=lambda r: self._pending[r][1].at)  # waited longest
                    slot, complete = self._pending.pop(rank)
                    await self._one(rank, slot, complete, self.peer)
        finally:
            self._close()

    def _current(self, rank: int, slot: int, complete: Complete) -> bool:
        slots = self._held.table.get(rank)
        return slots is not None and slots.complete.get(slot) is complete and slot not in slots.writing

    async def _one(self, rank: int, slot: int, complete: Complete, peer: Peer) -> None:
        if not self._current(rank, slot, complete) or not on_grid(complete.step, self.stride):
            return  # begun again already (a newer one is pending), or off a grid widened since
        stage = self._held.directory / STAGE
        if complete.nbytes > self.stage_bytes:
            over = self._held.total + complete.nbytes - self.stage_bytes - self._held.budget
            if over > 0:  # the oldest retained copies give way to the copy that retains a newer
                self.retained.reclaim(over, "the next copy to send needed the room")
            if self._held.total + complete.nbytes - self.stage_bytes > self._held.budget:
                why = f"no room to stage {complete.nbytes} bytes in --snapshot-memory"
                self._fail(rank, complete, peer, why)
                return
            self._held.grow(stage, complete.nbytes)
            self.stage_bytes = complete.nbytes
        await asyncio.to_thread(copy_file, str(self._held.path(rank, slot)), str(stage), complete.nbytes)
        if not self._current(rank, slot, complete):
            self.torn += 1
            return
        try:
            await self._send(rank, complete, peer, str(stage))
        except Exception as exc:
            self._close()  # never the daemon's loop: the copies stop until the next agreement
            self._fail(rank, complete, peer, f"{type(exc).__name__}: {exc}")

    async def _send(self, rank: int, complete: Complete, peer: Peer, stage: str) -> None:
        if self._conn is None:
            opening = asyncio.open_connection(peer.host, peer.port)
            async with asyncio.timeout(CONNECT_TIMEOUT):  # never wait_for: see snapshot_wire
                self._conn = await opening
        reader, writer = self._conn
        header: dict[str, Any] = {"kind": "replica", "token": peer.token, "job": self.job,
                                  "node": self.node_rank, "rank": rank, "step": complete.step,
                                  "bytes": complete.nbytes, "checksum": complete.checksum,
                                  "stride": self.stride}  # fmt: skip
        await send_header(writer, header)
        go = await read_header(reader, ANSWER_TIMEOUT)
        if go.get("have"):
            await self._kept(rank, complete, peer, stage)
            return
        if not go.get("ok"):
            self._fail(rank, complete, peer, f"the peer refused it: {go.get('why')}")
            return
        loop = asyncio.get_running_loop()
        started = self._clock.monotonic()  # the daemon's clock is the system's: real bandwidth
        with open(stage, "rb") as f:  # noqa: ASYNC230 - opening a tmpfs file does not block
            for offset in range(0, complete.nbytes, CHUNK):
                size = min(CHUNK, complete.nbytes - offset)
                wait = pause(offset, self.rate, self._clock.monotonic() - started)
                if wait > 0:
                    await self._clock.sleep(wait)
                await self._chunk(loop, writer, f, offset, size)
        verdict = await read_header(reader, ANSWER_TIMEOUT)
        if verdict.get("ok"):
            await self._kept(rank, complete, peer, stage)
        else:
            self._fail(rank, complete, peer, f"the peer did not keep it: {verdict.get('why')}")

    async def _chunk(
        self, loop: asyncio.AbstractEventLoop, writer: asyncio.StreamWriter, f: Any, offset: int, size: int
    ) -> None:
        if self._sendfile:
            # the kernel copies from the file to the socket: no pass through the daemon's
            # memory, and the loop never waits on a full socket
            try:
                await loop.sendfile(writer.transport, f, offset, size, fallback=False)
                return
            except (NotImplementedError, asyncio.SendfileNotAvailableError):
                self._sendfile = False  # uvloop's transports, for one: read and write instead
        writer.write(await asyncio.to_thread(read_chunk, f.fileno(), offset, size))
        await writer.drain()

    async def _kept(self, rank: int, complete: Complete, peer: Peer, stage: str) -> None:
        self.replicated[rank] = complete
        if await self.retained.keep(rank, Path(stage), complete):  # the staged copy is the retained one now
            self.stage_bytes = 0
        slots = self._held.table.get(rank)
        newest = None if slots is None else slots.newest()
        lag = 0 if newest is None else max(0, newest.step - complete.step)
        self._lags.append(lag)
        why = f"rank {rank}'s step {complete.step} reached node {peer.node} {lag} steps behind"
        self.widen(stride_for(lag, self.stride), why, lag)
        now = self._clock.monotonic()
        told = self._told.get(rank)
        if told is None or told[0] != self.generation or now - told[1] >= TAKEN_EVERY:
            self._told[rank] = (self.generation, now)
            self._events.emit(SnapshotReplicated(generation=self.generation, rank=rank, step=complete.step,
                                                 bytes=complete.nbytes, peer=peer.node,
                                                 seconds=round(now - complete.at, 6)))  # fmt: skip

    def _fail(self, rank: int, complete: Complete, peer: Peer, why: str) -> None:
        if not self._failed:  # once per peer: nothing more goes to it until the next agreement
            failed = SnapshotReplicationFailed(generation=self.generation, rank=rank, step=complete.step,
                                               peer=peer.node, why=why)  # fmt: skip
            self._events.emit(failed)
        self._failed = True

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                # at once, whatever is buffered: the peer drops the copy in flight (a close
                # would first flush what is queued, to a peer that may not read it)
                self._conn[1].transport.abort()
            self._conn = None

    def describe(self, now: float) -> dict[str, Any]:
        """Per rank the newest step the peer keeps, how many steps and seconds it lags."""
        ranks = {}
        for rank, slots in sorted(self._held.table.items()):
            newest, kept = slots.newest(), self.replicated.get(rank)
            if newest is None:
                continue
            ranks[str(rank)] = {
                "replicated_step": None if kept is None else kept.step,
                "lag_steps": None if kept is None else max(0, newest.step - kept.step),
                "lag_s": None if kept is None else round(max(0.0, newest.at - kept.at), 3),
            }
        peer = None if self.peer is None else {"node": self.peer.node, "failed": self._failed}
        return {"rate": self.rate, "peer": peer, "ranks": ranks, "torn": self.torn, "stride": self.stride,
                **self.retained.describe()}  # fmt: skip
