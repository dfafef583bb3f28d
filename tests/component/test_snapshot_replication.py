"""Snapshot replicas between two daemons' real pieces on loopback, in one process: the
ranks' slots (HeldSnapshots, in a directory of the test's), the sender (Replicator), the
receiver and its endpoint (Replicas), the fetch back (JobSnapshots). A slot is written
and declared complete as a rank's client does (begin, the bytes, done with the xxh3_64).
What must hold: a replica is complete only when its bytes match, comes back byte for
byte, a bad header is refused before anything is written, and a peer (or a sender) that
vanishes mid-copy is told once and costs no complete replica. A copy that ends steps behind
widens the job's grid, and the peer follows; a verified copy is retained by its sender;
replicas fit the budget by taking only the retained copies' room, never the ranks' own."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import xxhash

from supervisor.clock import SYSTEM
from supervisor.core.job_snapshots import NodeHeld
from supervisor.runtime.lifecycle.start import _loop_factory
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.services.held_snapshots import HeldSnapshots
from supervisor.runtime.services.job_snapshots import JobSnapshots, across_nodes
from supervisor.runtime.services.replicator import Peer
from supervisor.runtime.services.snapshot_wire import read_header, send_header
from supervisor.transport import schema

HOST = "127.0.0.1"
DEADLINE = 10.0


class Node:
    """One daemon's snapshot pieces, wired as the daemon wires them."""

    def __init__(self, tmp: Path, name: str, *, rate: int = 0, budget: int = 64 << 20) -> None:
        root = tmp / name
        root.mkdir()
        self.log = tmp / f"{name}.events.jsonl"
        events = EventLog(self.log, logging.getLogger(name), SYSTEM)
        self.held = HeldSnapshots(events, SYSTEM, budget=budget, token=secrets.token_hex(8), root=root)
        self.job: JobSnapshots = across_nodes(self.held, events, SYSTEM, rate=rate, job="t", host=HOST,
                                              inbox=lambda: None)  # fmt: skip
        self.replicas, self.replicator = self.job.replicas, self.job.replicator
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.job.run())
        await until(lambda: self.replicas.endpoint is not None)

    async def stop(self) -> None:
        """The daemon ends (or dies): its copies in flight end with it."""
        if self.task is not None:
            cancelled = self.task.cancel()
            done, _ = await asyncio.wait([self.task], timeout=5)
            # a copy that swallowed the cancel (3.11's wait_for did) would hold the daemon's exit
            assert done, f"not ended 5 s after its cancel ({cancelled}): {self.task!r}"
            self.replicas.close()

    def peer(self, node: int) -> Peer:
        assert self.replicas.endpoint is not None
        host, _, port = self.replicas.endpoint.rpartition(":")
        return Peer(node, host, int(port), self.replicas.token)

    async def take(self, rank: int, slot: int, step: int, data: bytes) -> None:
        """A rank's snapshot of ``step`` into ``slot``, complete."""
        begun = self.held.begin(schema.SnapshotBegin(rank, 0, "id", slot, len(data)))
        answer = begun if isinstance(begun, dict) else await begun  # a new slot's pages reserved first
        Path(answer["path"]).write_bytes(data)
        checksum = xxhash.xxh3_64_hexdigest(data)
        self.held.done(schema.SnapshotDone(rank, 0, slot, step, len(data), checksum))

    def events(self, name: str) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [e for e in map(json.loads, lines) if e["event"] == name]


async def until(predicate: Callable[[], object], what: str = "condition", timeout: float = DEADLINE) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


@pytest.fixture(params=["asyncio", "daemon"])
def loop(request: pytest.FixtureRequest) -> Callable[[], asyncio.AbstractEventLoop]:
    """asyncio's own loop (sendfile), and the daemon's (uvloop where installed: reads and writes)."""
    return asyncio.new_event_loop if request.param == "asyncio" else _loop_factory


Loop = Callable[[], asyncio.AbstractEventLoop]


def run(loop: Loop, tmp: Path, body: Callable[[Path], Awaitable[None]]) -> None:
    with asyncio.Runner(loop_factory=loop) as runner:
        runner.run(asyncio.wait_for(body(tmp), 30))


def payload(step: int, size: int) -> bytes:
    seed = f"step {step};".encode()
    return (seed * (size // len(seed) + 1))[:size]


def test_a_complete_snapshot_reaches_the_peer_verified_and_comes_back_byte_for_byte(
    tmp_path: Path, loop: Loop
) -> None:
    async def body(tmp: Path) -> None:
        sender, keeper, fresh = Node(tmp, "a", rate=1 << 30), Node(tmp, "b"), Node(tmp, "c")
        for n in (sender, keeper):
            await n.start()
        try:
            sender.replicator.target(keeper.peer(1), 0, 0)
            await sender.take(0, 0, 1, payload(1, 300_000))
            await until(lambda: sender.job.retained.steps() == {0: (1,)}, "step 1 kept and retained")
            await sender.take(0, 1, 2, payload(2, 200_000))
            await until(lambda: keeper.replicas.steps() == {0: (1, 2)}, "steps 1 and 2 kept")
            # a new daemon on the lost node, nothing in memory: it fetches step 2 into its slot
            kept = keeper.replicas
            record = NodeHeld(1, (), {}, kept.steps(), kept.endpoint, kept.token)
            await fresh.job.fetch_one(record, 0, 2, 0)
            found = fresh.held.table[0].holding(2)
            assert found is not None
            slot, held = found
            assert fresh.held.path(0, slot).read_bytes()[: held.nbytes] == payload(2, 200_000)
            assert held.checksum == xxhash.xxh3_64_hexdigest(payload(2, 200_000))
            status = sender.replicator.describe(SYSTEM.monotonic())
            assert status["ranks"]["0"]["replicated_step"] == 2 and status["ranks"]["0"]["lag_steps"] == 0
            assert [e["step"] for e in sender.events("snapshot_replicated")] == [1]  # sampled
            # the replicas and the retained copies count against the same budget as the slots:
            # each staged copy, once verified, is the rank's retained copy (no stage left)
            await until(lambda: sender.job.retained.steps() == {0: (1, 2)}, "step 2 retained")
            assert sender.replicator.stage_bytes == 0
            assert keeper.held.total == 500_000 and sender.held.total == 500_000 + 500_000
        finally:
            for n in (sender, keeper):
                await n.stop()

    run(loop, tmp_path, body)


def test_a_peer_that_vanishes_mid_copy_is_told_once_and_loses_no_complete_replica(
    tmp_path: Path, loop: Loop
) -> None:
    async def body(tmp: Path) -> None:
        sender, keeper = Node(tmp, "a", rate=4 << 20), Node(tmp, "b")  # 4 MiB/s: 8 MiB take 2 s
        for n in (sender, keeper):
            await n.start()
        try:
            sender.replicator.target(keeper.peer(1), 0, 0)
            await sender.take(0, 0, 1, payload(1, 4096))
            await until(lambda: keeper.replicas.steps() == {0: (1,)}, "step 1 kept")
            await sender.take(0, 1, 2, payload(2, 8 << 20))
            await until(lambda: keeper.replicas.table[0].writing, "step 2 in flight")
            await keeper.stop()  # the peer's daemon is gone mid-copy
            await until(lambda: sender.events("snapshot_replication_failed"), "the sender told")
            await sender.take(0, 0, 3, payload(3, 4096))  # more snapshots: no more copies, no more events
            await asyncio.sleep(0.1)
            (failed,) = sender.events("snapshot_replication_failed")
            assert (failed["rank"], failed["step"], failed["peer"]) == (0, 2, 1)
            assert sender.held.table[0].steps() == {2, 3}  # its own slots untouched
            # the keeper's complete replica of step 1 is whole: its bytes match its checksum
            assert keeper.replicas.steps() == {0: (1,)}
            found = keeper.replicas.table[0].holding(1)
            assert found is not None
            data = keeper.replicas.path_of(0, found[0]).read_bytes()[: found[1].nbytes]
            assert xxhash.xxh3_64_hexdigest(data) == found[1].checksum
        finally:
            await sender.stop()

    run(loop, tmp_path, body)


def test_a_sender_that_vanishes_mid_copy_costs_the_keeper_no_complete_replica(
    tmp_path: Path, loop: Loop
) -> None:
    async def body(tmp: Path) -> None:
        sender, keeper = Node(tmp, "a", rate=4 << 20), Node(tmp, "b")
        for n in (sender, keeper):
            await n.start()
        try:
            sender.replicator.target(keeper.peer(1), 0, 0)
            await sender.take(0, 0, 1, payload(1, 4096))
            await until(lambda: keeper.replicas.steps() == {0: (1,)}, "step 1 kept")
            await sender.take(0, 1, 2, payload(2, 8 << 20))
            await until(lambda: keeper.replicas.table[0].writing, "step 2 in flight")
            await sender.stop()
            await until(lambda: keeper.events("snapshot_replica_rejected"), "the keeper told")
            (rejected,) = keeper.events("snapshot_replica_rejected")
            assert (rejected["node"], rejected["rank"], rejected["step"]) == (0, 0, 2)
            assert "went away" in rejected["why"]
            assert keeper.replicas.steps() == {0: (1,)}
        finally:
            await keeper.stop()

    run(loop, tmp_path, body)


def test_a_bad_header_is_refused_before_anything_is_written_and_bad_bytes_are_not_kept(
    tmp_path: Path, loop: Loop
) -> None:
    async def body(tmp: Path) -> None:
        keeper = Node(tmp, "b", budget=1 << 20)
        await keeper.start()
        peer = keeper.peer(1)
        good = {"kind": "replica", "token": peer.token, "job": "t", "node": 0, "rank": 0, "step": 1,
                "bytes": 1000, "checksum": xxhash.xxh3_64_hexdigest(b"x" * 1000)}  # fmt: skip

        async def offer(header: dict[str, Any], data: bytes = b"") -> list[dict[str, Any]]:
            reader, writer = await asyncio.open_connection(peer.host, peer.port)
            try:
                await send_header(writer, header)
                answers = [await read_header(reader, DEADLINE)]
                if answers[0].get("ok") and data:
                    writer.write(data)
                    answers.append(await read_header(reader, DEADLINE))
                return answers
            finally:
                writer.close()

        try:
            for bad in ({"token": "another job's"}, {"bytes": 2 << 20}, {"step": "1"}):
                (answer,) = await offer(good | bad)
                assert answer["ok"] is False, bad
            assert not list(keeper.held.directory.parent.glob("*/replica.*"))  # nothing written
            go, verdict = await offer(good, b"y" * 1000)  # not the bytes the checksum is of
            assert go == {"ok": True} and verdict["ok"] is False and "checksum" in verdict["why"]
            assert keeper.replicas.steps() == {}
            assert await offer(good, b"x" * 1000) == [{"ok": True}, {"ok": True}]
            assert keeper.replicas.steps() == {0: (1,)}
            whys = [e["why"] for e in keeper.events("snapshot_replica_rejected")]
            assert any("token" in w for w in whys) and any("checksum" in w for w in whys), whys
        finally:
            await keeper.stop()

    run(loop, tmp_path, body)


def test_a_copy_that_ends_steps_behind_widens_the_grid_and_the_peer_follows(
    tmp_path: Path, loop: Loop
) -> None:
    async def body(tmp: Path) -> None:
        sender, keeper = Node(tmp, "a", rate=2 << 20), Node(tmp, "b")  # 2 MiB/s: 3 MiB take 1 s
        for n in (sender, keeper):
            await n.start()
        try:
            sender.replicator.target(keeper.peer(1), 0, 0)
            await sender.take(0, 1, 1, payload(1, 3 << 20))
            table = keeper.replicas.table
            await until(lambda: 0 in table and table[0].writing, "step 1 in flight")
            for step in (2, 3, 4):  # the rank goes on while step 1 is on its way
                await sender.take(0, step % 2, step, payload(step, 4096))
            # step 1 verified three steps behind: every 4th step from now (step 4, pending, is one)
            await until(lambda: 4 in sender.job.retained.steps().get(0, ()), "step 4 retained")
            (widened,) = sender.events("snapshot_stride_changed")
            assert (widened["stride"], widened["lag_steps"]) == (4, 3)
            # step 4's header told the keeper, whose own replicas follow the same grid
            assert keeper.replicator.stride == 4
            (followed,) = keeper.events("snapshot_stride_changed")
            assert followed["lag_steps"] is None and "node 0 replicates every 4 steps" in followed["why"]
            for step in (5, 6, 7, 8):  # 5 to 7 are off the grid: never queued to be sent
                await sender.take(0, step % 2, step, payload(step, 4096))
                assert sender.replicator.waiting == ({0: 8} if step == 8 else {}), step
            await until(lambda: keeper.replicas.steps() == {0: (4, 8)}, "step 8 kept, 5 to 7 not sent")
            await until(lambda: sender.job.retained.steps() == {0: (4, 8)}, "steps 4 and 8 retained")
        finally:
            for n in (sender, keeper):
                await n.stop()

    run(loop, tmp_path, body)


def test_replicas_take_only_the_retained_copies_room_and_are_refused_once_when_none_is_left(
    tmp_path: Path, loop: Loop
) -> None:
    async def body(tmp: Path) -> None:
        keeper = Node(tmp, "b", rate=1 << 30, budget=1_000_000)
        sender = Node(tmp, "a", rate=1 << 30)
        for n in (sender, keeper):
            await n.start()
        try:
            keeper.replicator.target(sender.peer(0), 0, 1)
            sender.replicator.target(keeper.peer(1), 0, 0)
            # the keeper's own rank: two slots of 200 kB, both retained once its peer verified them
            for step in (1, 2):
                await keeper.take(1, step % 2, step, payload(step, 200_000))
                await until(lambda s=step: s in keeper.job.retained.steps().get(1, ()), "retained")
            assert keeper.held.total == 800_000
            # the sender's verdicts are in (retained) before its rank goes on: a step taken
            # before would count in the copy's lag, and a wider grid skip the next step
            await sender.take(0, 1, 1, payload(1, 150_000))  # fits beside all of it
            await until(lambda: keeper.replicas.steps() == {0: (1,)}, "step 1 kept")
            await until(lambda: 1 in sender.job.retained.steps().get(0, ()), "step 1 retained")
            assert keeper.job.retained.steps() == {1: (1, 2)}
            # 300 kB more fit only without the retained copies: they give way, oldest first
            await sender.take(0, 0, 2, payload(2, 300_000))
            await until(lambda: keeper.replicas.steps() == {0: (1, 2)}, "step 2 kept")
            await until(lambda: 2 in sender.job.retained.steps().get(0, ()), "step 2 retained")
            assert keeper.job.retained.steps() == {}
            (dropped,) = keeper.events("snapshot_retained_dropped")
            assert (dropped["rank"], dropped["step"]) == (1, 1) and "replica" in dropped["why"]
            # 700 kB do not fit without the rank's own slots: refused, and they stay complete
            await sender.take(0, 1, 3, payload(3, 700_000))
            await until(lambda: sender.events("snapshot_replication_failed"), "the sender told")
            sender.replicator.target(keeper.peer(1), 1, 0)  # the next generation offers it again
            await sender.take(0, 0, 4, payload(4, 700_000))
            await until(lambda: len(sender.events("snapshot_replication_failed")) == 2, "refused again")
            (rejected,) = keeper.events("snapshot_replica_rejected")  # one event, however often
            assert (rejected["rank"], rejected["step"]) == (0, 3) and "no room" in rejected["why"]
            assert keeper.held.table[1].steps() == {1, 2} and keeper.replicas.steps() == {0: (1, 2)}
            assert keeper.held.total <= keeper.held.budget
        finally:
            for n in (sender, keeper):
                await n.stop()

    run(loop, tmp_path, body)
