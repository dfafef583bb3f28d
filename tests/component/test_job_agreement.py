"""The job's agreement on the restored step (runtime.services.job_snapshots) through a
real c10d store (torch's TCPStore, one client a node), two nodes' real pieces in one
process: a node that lost everything fetches its rank's step from the peer's replica
before its rank's restore is answered; a node that never publishes means no memory
restore, answered within the gather's deadline. A rank's restore request waits for the
agreement: its answer goes to the inbox (``Answers``: the rank's socket, as the
monitor's inbox would send it)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from supervisor.coord.job import JobGeneration
from supervisor.process.ports import free_port
from supervisor.runtime.services.job_snapshots import GATHER_S
from supervisor.transport import schema
from tests.component.test_snapshot_replication import Node, payload, until

pytestmark = [pytest.mark.torch]


@dataclass
class Answers:
    """Where the daemon's deferred answers go: (the asker's identity, the ack)."""

    identity: bytes = b"rank"
    sent: list[tuple[bytes, dict[str, Any]]] = field(default_factory=list)

    def send(self, identity: bytes, payload: bytes) -> bool:
        self.sent.append((identity, json.loads(payload)))
        return True


def job_generation(port: int, node_rank: int, generation: int = 0) -> JobGeneration:
    from torch.distributed import PrefixStore, TCPStore  # noqa: PLC0415 - torch only here

    from supervisor.coord.torchrdzv import Patience, PatientStore  # noqa: PLC0415

    client = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    store = PatientStore(PrefixStore(f"round{generation}", client), Patience(5.0))
    return JobGeneration(generation, node_rank, 2, "127.0.0.1", 0, generation, SimpleNamespace(store=store))  # type: ignore[arg-type]


@pytest.fixture
def store_port() -> Any:
    from torch.distributed import TCPStore  # noqa: PLC0415

    port = free_port()
    master = TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True, wait_for_workers=False)
    yield port
    del master


def node(tmp: Path, name: str, answers: Answers, rate: int = 0) -> Node:
    n = Node(tmp, name, rate=rate)
    n.job._inbox = lambda: answers  # the monitor's inbox, where answers go
    return n


def test_a_node_that_lost_everything_restores_its_rank_from_the_peers_replica(
    tmp_path: Path, store_port: int
) -> None:
    async def body() -> None:
        a_answers, b_answers = Answers(), Answers()
        survivor, lost = node(tmp_path, "a", a_answers), node(tmp_path, "b", Answers(), rate=1 << 30)
        for n in (survivor, lost):
            await n.start()
        # generation 0: node 1 replicates its rank's snapshots to node 0, then is lost whole
        lost.replicator.target(survivor.peer(0), 0, 1)
        for step in (1, 2):
            await survivor.take(0, step % 2, step, payload(step, 50_000))
            await lost.take(1, step % 2, step, payload(100 + step, 70_000))
            await until(lambda s=step: s in survivor.replicas.steps().get(1, ()), "rank 1's replica kept")
        await lost.stop()
        replacement = node(tmp_path, "c", b_answers)
        await replacement.start()
        try:
            gens = [job_generation(store_port, n, generation=1) for n in (0, 1)]
            survivor.job.joined(gens[0], [0])
            replacement.job.joined(gens[1], [1])
            # the ranks ask at once: their answers wait for the agreement
            assert survivor.job.handle(schema.SnapshotRestore(0, 1, "r0"), [0]) is None
            assert replacement.job.handle(schema.SnapshotRestore(1, 1, "r1"), [1]) is None
            await until(lambda: a_answers.sent and b_answers.sent, "both answered")
            (_, a), (_, b) = a_answers.sent[0], b_answers.sent[0]
            assert (a["id"], a["step"], b["id"], b["step"]) == ("r0", 2, "r1", 2)
            # the replacement's slot holds what rank 1 snapshotted at step 2, byte for byte
            assert Path(b["path"]).read_bytes()[: b["bytes"]] == payload(102, 70_000)
            assert [e["source"] for e in replacement.events("snapshot_restored")] == ["peer"]
            assert [e["source"] for e in survivor.events("snapshot_restored")] == ["memory"]
            (agreed,) = replacement.events("snapshots_agreed")
            assert (agreed["step"], agreed["peers"]) == (2, [1])
            # from now on the replacement sends its rank's snapshots to node 0 again
            assert replacement.replicator.peer is not None and replacement.replicator.peer.node == 0
        finally:
            for n in (survivor, replacement):
                await n.stop()

    asyncio.run(asyncio.wait_for(body(), 60))


def test_a_node_that_never_publishes_means_no_memory_restore_answered_within_the_deadline(
    tmp_path: Path, store_port: int
) -> None:
    """Node 1 never publishes: no memory restore, answered within the gather's deadline. The
    ranks start from disk or afresh and train step 1 again, so node 0's retained copy and
    its replica of step 1 are of the timeline left behind: dropped, or a later agreement
    could pair them with the new step 1 of another rank."""

    async def body() -> None:
        answers = Answers()
        alone, peer = node(tmp_path, "a", answers, rate=1 << 30), node(tmp_path, "b", Answers(), rate=1 << 30)
        for n in (alone, peer):
            await n.start()
        try:
            alone.replicator.target(peer.peer(1), 0, 0)
            peer.replicator.target(alone.peer(0), 0, 1)
            await alone.take(0, 1, 1, payload(1, 1000))
            await peer.take(1, 1, 1, payload(101, 1000))
            kept = alone.job.retained.steps, alone.replicas.steps
            await until(lambda: kept[0]() == {0: (1,)} and kept[1]() == {1: (1,)}, "retained and kept")
            started = time.monotonic()
            alone.job.joined(job_generation(store_port, 0), [0])
            assert alone.job.handle(schema.SnapshotRestore(0, 0, "r0"), [0]) is None
            await until(lambda: answers.sent, "answered", timeout=GATHER_S + 10)
            assert answers.sent[0][1]["step"] is None
            assert time.monotonic() - started < GATHER_S + 5  # the gather's deadline, not the ready one's
            (agreed,) = alone.events("snapshots_agreed")
            assert agreed["step"] is None and "node(s) [1] published nothing" in agreed["why"]
            assert kept[0]() == {} and kept[1]() == {}
            assert not list(alone.held.directory.glob("re*.rank*"))  # their memory given back
            assert alone.held.table[0].steps() == {1}  # the rank's own slots: it overwrites them itself
        finally:
            for n in (alone, peer):
                await n.stop()

    asyncio.run(asyncio.wait_for(body(), 60))


def test_a_replica_several_steps_behind_still_meets_a_step_every_rank_holds(
    tmp_path: Path, store_port: int
) -> None:
    """Both nodes replicate every 4th step (the job's grid: a copy slower than a step widens
    it) and retain their own ranks' copies of what their peer verified. The ranks go on to
    step 11: their slots hold 10 and 11, the replica of node 1's rank is step 8, three
    behind. Node 1 is lost whole: the job agrees on step 8, node 0's rank from its retained
    copy, node 1's from the replica. Node 1 also ran rank 3 before; nobody runs it now, so
    node 0 releases its replica once the agreement is over."""

    async def body() -> None:
        a_answers, b_answers = Answers(), Answers()
        survivor = node(tmp_path, "a", a_answers, rate=1 << 30)
        lost = node(tmp_path, "b", Answers(), rate=1 << 30)
        for n in (survivor, lost):
            await n.start()
        survivor.replicator.target(lost.peer(1), 0, 0)
        lost.replicator.target(survivor.peer(0), 0, 1)
        for n in (survivor, lost):
            n.replicator.widen(4, "as the job's agreement would")
        for step in range(1, 12):
            await survivor.take(0, step % 2, step, payload(step, 50_000))
            await lost.take(1, step % 2, step, payload(100 + step, 70_000))
            await lost.take(3, step % 2, step, payload(300 + step, 30_000))
            if step % 4 == 0:  # each verified and retained by its sender before the rank goes on
                await until(lambda s=step: s in survivor.job.retained.steps().get(0, ()), "0 retained")
                kept = lost.job.retained.steps
                await until(lambda s=step, k=kept: all(s in k().get(r, ()) for r in (1, 3)), "1, 3 retained")
        assert survivor.held.table[0].steps() == {10, 11}
        assert survivor.job.retained.steps() == {0: (4, 8)}
        assert survivor.replicas.steps() == {1: (4, 8), 3: (4, 8)}
        await lost.stop()
        replacement = node(tmp_path, "c", b_answers)
        await replacement.start()
        try:
            gens = [job_generation(store_port, n, generation=1) for n in (0, 1)]
            survivor.job.joined(gens[0], [0])
            replacement.job.joined(gens[1], [1])
            assert survivor.job.handle(schema.SnapshotRestore(0, 1, "r0"), [0]) is None
            assert replacement.job.handle(schema.SnapshotRestore(1, 1, "r1"), [1]) is None
            await until(lambda: a_answers.sent and b_answers.sent, "both answered")
            (_, a), (_, b) = a_answers.sent[0], b_answers.sent[0]
            assert (a["step"], b["step"]) == (8, 8), (a, b)
            # step 8 byte for byte: node 0's copied from its retained copy into a slot of its rank
            assert Path(a["path"]).read_bytes()[: a["bytes"]] == payload(8, 50_000)
            assert Path(b["path"]).read_bytes()[: b["bytes"]] == payload(108, 70_000)
            (agreed,) = survivor.events("snapshots_agreed")
            assert (agreed["step"], agreed["retained"], agreed["peers"]) == (8, [0], [])
            assert [e["source"] for e in replacement.events("snapshot_restored")] == ["peer"]
            # node 0's copies kept up within a step: the agreement narrows the job's grid to
            # every step again, on both nodes (the replacement had none of its own)
            assert survivor.replicator.stride == replacement.replicator.stride == 1
            assert [e["stride"] for e in survivor.events("snapshot_stride_changed")] == [4, 1]
            # rank 3's replica: released with its memory, rank 1's kept
            assert survivor.replicas.steps() == {1: (4, 8)}
            assert not list(survivor.held.directory.glob("replica.rank3.*"))
            (released,) = survivor.events("snapshot_replicas_released")
            assert (released["ranks"], released["bytes"]) == ([3], 60_000)
        finally:
            for n in (survivor, replacement):
                await n.stop()

    asyncio.run(asyncio.wait_for(body(), 60))
