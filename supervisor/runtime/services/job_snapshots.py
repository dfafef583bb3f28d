"""The job's agreement on the step its ranks restore, and the restore of a lost node's
ranks from a peer's replica.

Right after a node joins a generation (before its ranks ask), its daemon publishes what it
holds through the rendezvous store (``coord.snapshot_round``): its ranks' complete steps,
the replicas it keeps, its retained copies, its replica endpoint and stride. Once every
node's record is in (or the deadline passed) the pure ``core.job_snapshots.decide`` picks
the newest step every rank of the job can have and where each rank finds it. A rank whose
step this node holds only in a retained copy gets it copied into one of its slots. A rank
whose own node lost it (a new daemon: the whole node was killed and started again) gets it
from the peer that kept the replica: this daemon fetches it into the rank's own slot file,
verified against its checksum, so the rank's ``restore()`` maps it as any other (the ranks
need no address of a peer, and a fetch that fails fails before any rank has restored
anything). Then each
node says it is ready for that step, and only when every node is ready for the same step
does the generation restore it; anything else (a node late, a fetch that failed) means no
memory restore this generation, one event says why, and the ranks go on from disk or
afresh, never from mixed steps. Once every node said it is ready (all fetches done), the
replicas of ranks the previous node no longer runs, and the retained copies of ranks this
node no longer runs, are released; so are the replicas and retained copies of steps newer
than the one agreed (all of them when none is): the ranks train those steps again.

Meanwhile a rank's ``restore`` request waits: it is answered (through the inbox, to the
rank that asked) once the generation's step is pinned.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from supervisor.aio import in_thread
from supervisor.clock import Clock
from supervisor.coord import snapshot_round as rnd
from supervisor.core.catalogue.snapshots import SnapshotReplicaRejected, SnapshotsAgreed
from supervisor.core.job_snapshots import (
    JobRestore,
    NodeHeld,
    agreed_stride,
    confirm,
    decide,
    left_behind,
    peer_of,
    stale_replicas,
)
from supervisor.core.memory_snapshots import held_steps
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.services.held_snapshots import Answer, HeldSnapshots, SnapshotMessage
from supervisor.runtime.services.replicas import Replicas
from supervisor.runtime.services.replicator import CONNECT_TIMEOUT, Peer, Replicator, parse_endpoint
from supervisor.runtime.services.retained import Retained
from supervisor.runtime.services.snapshot_wire import (
    STREAM_LIMIT,
    WireError,
    read_header,
    receive_into,
    send_header,
)
from supervisor.transport import schema

if TYPE_CHECKING:
    from supervisor.coord.job import JobGeneration

GATHER_S = 2.0  # seconds every node's record may take (the nodes joined together: milliseconds)
FETCH_S = 30.0  # seconds a chunk of a replica fetched back may take
MAX_WAITING = 4096  # restore requests held at once (a rank asks once; beyond: nothing restored)
READY_S = 60.0  # seconds the nodes may take to fetch what they lack and say they are ready


class JobSnapshots:
    def __init__(self, held: HeldSnapshots, replicas: Replicas, replicator: Replicator, events: EventLog,
                 clock: Clock, *, inbox: Callable[[], Any]) -> None:  # fmt: skip
        """``inbox``: the monitor's (its ``identity`` and ``send``), where answers go."""
        self._held, self.replicas, self.replicator = held, replicas, replicator
        self._events, self._clock, self._inbox = events, clock, inbox
        self._published: dict[int, NodeHeld] = {}
        self._listening = asyncio.Event()  # the replica endpoint is up (or could not be)
        self._agreeing: set[int] = set()  # generations whose step is not pinned yet
        self._latest = -1  # the newest generation joined: an older agreement pins nothing
        self._waiting: list[tuple[schema.SnapshotRestore, bytes | None, Collection[int]]] = []
        self.tasks: set[asyncio.Task[None]] = set()

    # -- the endpoint and the copies, for the daemon's life -----------------------------

    async def run(self) -> None:
        """Take replicas and serve them back; send this node's to the next node."""
        try:
            try:
                await self.replicas.start()
            except OSError as exc:
                self.replicas.endpoint = None
                self._events.emit(SnapshotReplicaRejected(node=None, rank=None, step=None,
                                                          why=f"no replica endpoint: {exc}"))  # fmt: skip
            self._listening.set()
            await self.replicator.run()
        finally:
            self.replicas.close()

    @property
    def retained(self) -> Retained:
        return self.replicator.retained

    def describe(self, now: float) -> dict[str, Any]:
        return {**self.replicator.describe(now), "endpoint": self.replicas.endpoint,
                "replicas": {str(r): list(s) for r, s in self.replicas.steps().items()},
                "replica_bytes": self.replicas.bytes}  # fmt: skip

    # -- the ranks' requests (in front of HeldSnapshots.handle) ---------------------------

    def handle(self, m: SnapshotMessage, ranks: Collection[int]) -> Answer:
        if isinstance(m, schema.SnapshotRestore) and m.gen in self._agreeing:
            if len(self._waiting) >= MAX_WAITING:
                return {"step": None}  # never this node's own step before the job's
            self._waiting.append((m, self._inbox().identity, ranks))  # answered once pinned
            return None
        return self._held.handle(m, ranks)

    def _answer_waiting(self, generation: int) -> None:
        waiting, self._waiting = self._waiting, []
        for m, identity, ranks in waiting:
            if m.gen != generation:
                self._waiting.append((m, identity, ranks))
            elif identity is not None:
                # a generation already over gets nothing (and pins nothing over the newer one's)
                answer = self._held.restore(m, ranks) if generation == self._latest else {"step": None}
                self._inbox().send(identity, schema.encode("ack", id=m.id, **answer))

    # -- a generation joined --------------------------------------------------------------

    def joined(self, job_gen: JobGeneration, ranks: Collection[int]) -> None:
        """Agree, in the background, on the step ``job_gen``'s ranks (``ranks``: this
        node's) restore; their restore requests wait until then."""
        if job_gen.joined is None:
            return  # a node alone: its own memory decides (HeldSnapshots)
        for old in self.tasks:  # the generation it was for is over
            old.cancel()
        self._latest = job_gen.generation
        self._agreeing.add(job_gen.generation)
        task = asyncio.get_running_loop().create_task(self._agree(job_gen, ranks), name="snapshots-agree")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _agree(self, job_gen: JobGeneration, ranks: Collection[int]) -> None:
        gen, started = job_gen.generation, self._clock.monotonic()
        step, why, peers, kept = None, "", list[int](), list[int]()
        try:
            decision = await self._decide(job_gen, ranks)
            kept = decision.kept(ranks)
            ready, why, peers = await self._fetch(decision, job_gen, ranks)
            joined, n = job_gen.joined, job_gen.nnodes
            assert joined is not None
            node = job_gen.node_rank
            await in_thread(lambda: rnd.publish_ready(joined, node, ready, why), "snapshots-ready")
            if ready is not None:  # not ready itself: nothing the others say can make a step
                answers = await in_thread(
                    lambda: rnd.gather_ready(joined, n, READY_S, self._clock), "snapshots-all"
                )
                step, why = confirm(answers, n)
            # every fetch it could serve is over (or, not ready itself, the job restores none)
            self._release(job_gen, ranks, step)
        except Exception as exc:  # a store gone, a peer gone: no memory restore, never a stuck rank
            step, why = None, f"the agreement failed: {type(exc).__name__}: {exc}"
        finally:
            sources = {rank: "peer" if rank in peers else "memory" for rank in ranks}
            if gen == self._latest:  # never over a newer generation's step
                self._held.pin(gen, step, sources if step is not None else {})
            self._agreeing.discard(gen)
            self._answer_waiting(gen)
        self._events.emit(SnapshotsAgreed(generation=gen, step=step, why=why,
                                          peers=sorted(peers) if step is not None else [],
                                          retained=kept if step is not None else [],
                                          seconds=round(self._clock.monotonic() - started, 6)))  # fmt: skip

    async def _decide(self, job_gen: JobGeneration, ranks: Collection[int]) -> JobRestore:
        joined, n = job_gen.joined, job_gen.nnodes
        assert joined is not None
        with contextlib.suppress(TimeoutError):  # without an endpoint: nothing replicated here
            async with asyncio.timeout(GATHER_S):  # never wait_for: see snapshot_wire
                await self._listening.wait()
        await self._held.sealed_before(job_gen.generation)  # copies whole of ranks gone before their done
        # every rank this node holds, of this generation or one it ran before the order changed
        held = held_steps(self._held.table, set(ranks) | set(self._held.table))
        mine = {r: tuple(s) for r, s in held.items() if s}
        record = NodeHeld(job_gen.node_rank, tuple(sorted(ranks)), mine, self.replicas.steps(),
                          self.replicas.endpoint, self.replicas.token, self.retained.steps(),
                          self.replicator.need)  # fmt: skip
        await in_thread(lambda: rnd.publish(joined, record), "snapshots-publish")
        published = await in_thread(lambda: rnd.gather(joined, n, GATHER_S, self._clock), "snapshots-gather")
        # the next node takes this node's replicas from now on (membership may have changed)
        after = peer_of(job_gen.node_rank, n)
        endpoint = None if after is None or after not in published else published[after].endpoint
        peer = None
        if endpoint is not None and after is not None:
            host, port = parse_endpoint(endpoint)
            peer = Peer(after, host, port, published[after].token)
        self.replicator.target(peer, job_gen.generation, job_gen.node_rank)
        why = "the job's agreement: the widest its nodes' recent copies needed"
        self.replicator.settle(agreed_stride(published), why)
        self._published = published
        return decide(published, n)

    async def _fetch(
        self, decision: JobRestore, job_gen: JobGeneration, ranks: Collection[int]
    ) -> tuple[int | None, str, list[int]]:
        """Fetch what this node's ranks lack from the peers that keep it: (the step this
        node is ready for, or None; why; the ranks fetched)."""
        step = decision.step
        if step is None:
            return None, decision.why, []
        for rank in decision.kept(ranks):
            try:
                await self.retained.restore_into(rank, step)
            except (OSError, ValueError) as exc:
                return None, f"rank {rank}'s step {step} from its retained copy: {exc}", []
        fetched = []
        for rank, node in decision.fetched(job_gen.node_rank, ranks).items():
            record = self._published[node]  # this node's own too: the job's order changed
            if record.endpoint is None:
                return None, f"node {node} keeps rank {rank}'s step {step} but has no endpoint", []
            try:
                await self.fetch_one(record, rank, step, job_gen.node_rank)
            except (OSError, WireError, TimeoutError, ValueError) as exc:
                return None, f"rank {rank}'s step {step} from node {node}: {type(exc).__name__}: {exc}", []
            fetched.append(rank)
        return step, decision.why, fetched

    def _release(self, job_gen: JobGeneration, ranks: Collection[int], step: int | None) -> None:
        """What nobody needs any more, now that the job's order and step are known: the
        replicas of ranks the previous node does not run, the retained copies of ranks not
        run here, and the copies of steps of a timeline the job left (``left_behind``)."""
        self.retained.drop(left_behind(self.retained.steps(), step))
        self.replicas.drop(left_behind(self.replicas.steps(), step))
        node, n = job_gen.node_rank, job_gen.nnodes
        stale = stale_replicas(node, n, self._published, self.replicas.table)
        before = (node - 1) % n if n > 1 else None
        self.replicas.release(stale, job_gen.generation, f"node {before} (the one that replicates here) "
                              f"does not run them in generation {job_gen.generation}")  # fmt: skip
        self.retained.release(ranks)

    async def fetch_one(self, record: NodeHeld, rank: int, step: int, node_rank: int) -> None:
        assert record.endpoint is not None
        host, port = parse_endpoint(record.endpoint)
        opening = asyncio.open_connection(host, port, limit=STREAM_LIMIT)
        async with asyncio.timeout(CONNECT_TIMEOUT):
            reader, writer = await opening
        try:
            await send_header(writer, {"kind": "fetch", "token": record.token, "node": node_rank,
                                       "rank": rank, "step": step})  # fmt: skip
            answer = await read_header(reader, FETCH_S)
            nbytes, checksum = answer.get("bytes"), answer.get("checksum")
            if not answer.get("ok") or type(nbytes) is not int or not isinstance(checksum, str):
                raise ValueError(f"the peer has no replica: {answer.get('why')}")
            slot = 0  # the rank restores it, then writes its next snapshot into slot 1
            target = self._held.reserve(rank, slot, nbytes)
            if isinstance(target, str):
                raise ValueError(target)  # noqa: TRY004 - a refusal, told as the others are
            fd = os.open(target, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                digest = await receive_into(reader, fd, nbytes, FETCH_S)
            finally:
                os.close(fd)
            if digest != checksum:
                raise ValueError(f"the replica's checksum is {digest}, not {checksum}")
            if not self._held.adopt(rank, slot, step, nbytes, checksum):
                raise ValueError("the fetched slot could not be recorded")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def across_nodes(held: HeldSnapshots, events: EventLog, clock: Clock, *, rate: int, job: str, host: str,
                 inbox: Callable[[], Any]) -> JobSnapshots:  # fmt: skip
    """The pieces wired to ``held``: replicas kept and sent within its budget, a complete
    slot offered to the sender, the retained copies giving way to the rest."""
    retained = Retained(held, events, clock)
    replicas = Replicas(held, events, clock, host=host, retained=retained)
    replicator = Replicator(held, events, clock, rate=rate, job=job, retained=retained)
    held.extra = lambda: replicas.bytes + replicator.stage_bytes + retained.bytes
    held.on_complete = replicator.offer
    held.reclaim = lambda need: retained.reclaim(need, "a rank's own snapshot needed the room")
    replicas.on_stride = replicator.widen
    return JobSnapshots(held, replicas, replicator, events, clock, inbox=inbox)
