"""Snapshots held by the daemon, on virtual time: fake ranks speak the client's snapshot
messages to the real daemon and write their slot files themselves, as the client does.

The daemon's answers go back on the ROUTER socket, which no fake can read: ``Replies``
stands between (as tests/fast/fakes_gasp.py does for "save now"), keeping each reply the
real inbox sends, by request id. Most requests are answered as they are delivered; a
begin that grows a slot file once its pages are reserved in a thread (the virtual clock
stands still meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli.control import render_status
from supervisor.runtime.lifecycle.daemon import Supervisor
from supervisor.runtime.services.held_snapshots import LOCK, SHM, HeldSnapshots, _locked, remove_stale
from supervisor.runtime.services.metrics import Metrics
from tests.fast.fakes import Rank
from tests.fast.harness import Operator, Watcher, supervise


@dataclass
class Replies:
    """The daemon's acks, by request id."""

    by_id: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    status: list[dict[str, Any]] = field(default_factory=list)  # taken by the operator

    def operator(self, then: Operator | None = None) -> Operator:
        async def act(daemon: Supervisor, seen: Watcher) -> None:
            inbox = daemon.monitor.inbox
            real_reply = inbox.reply

            def reply(identity: bytes | None, request_id: str | None, **data: object) -> None:
                waiting = None if request_id is None else self.by_id.get(request_id)
                if waiting is not None and not waiting.done():
                    waiting.set_result(dict(data))
                real_reply(identity, request_id, **data)

            inbox.reply = reply  # type: ignore[method-assign]
            if then is not None:
                await then(daemon, seen)

        return act

    async def ask(self, r: Rank, kind: str, **fields: Any) -> dict[str, Any] | None:
        """A request and its answer; None when the daemon did not answer (a dropped request)."""
        request_id = secrets.token_hex(4)
        waiting = self.by_id[request_id] = asyncio.get_running_loop().create_future()
        r.send(kind, id=request_id, **fields)
        try:
            return await asyncio.wait_for(waiting, ANSWER_WITHIN)
        except TimeoutError:
            return None
        finally:
            del self.by_id[request_id]


ANSWER_WITHIN = 1.0  # virtual seconds: the client's own wait for a begin


def content(rank: int, step: int, nbytes: int) -> bytes:
    seed = f"rank {rank} step {step};".encode()
    return (seed * (nbytes // len(seed) + 1))[:nbytes]


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()  # the client's is xxh3_64: 16 hex digits too


async def snapshot(
    replies: Replies, r: Rank, step: int, nbytes: int = 4096, *, done: bool = True
) -> dict[str, Any]:
    """What ``client.snapshot`` does: begin the slot, write it, checksum it, say done."""
    slot = step % 2
    answer = await replies.ask(r, "snapshot_begin", slot=slot, bytes=nbytes)
    assert answer is not None
    if not answer["ok"]:
        return answer
    data = content(r.rank, step, nbytes)
    with open(answer["path"], "r+b") as f:  # mapped by the client; the file stays the daemon's size
        f.write(data if done else data[: nbytes // 2])  # a copy cut off by the rank's death
    if done:
        r.send("snapshot_done", slot=slot, step=step, bytes=nbytes, checksum=digest(data))
    return answer


async def restore(replies: Replies, r: Rank) -> tuple[int, bytes, dict[str, Any]] | None:
    """What ``client.restore`` does: ask, read the slot, verify its checksum."""
    answer = await replies.ask(r, "snapshot_restore")
    assert answer is not None
    if answer["step"] is None:
        return None
    data = Path(answer["path"]).read_bytes()[: answer["bytes"]]
    assert digest(data) == answer["checksum"], answer
    return answer["step"], data, answer


def test_a_crash_and_its_restart_lose_nothing_held(tmp_path: Path) -> None:
    replies, restored, modes = Replies(), {}, {}
    served: dict[tuple[str, str | None], float] = {}  # the metrics endpoint's snapshot samples

    async def trains(r: Rank) -> int | None:
        r.hello()
        if r.generation == 0:
            for step in range(5):
                await r.sleep(1.0)
                path = Path((await snapshot(replies, r, step))["path"])
                modes[r.rank] = (stat.S_IMODE(path.parent.stat().st_mode), stat.S_IMODE(path.stat().st_mode))
            await r.sleep(0.1)
            if r.rank == 1:
                return 1
            await r.hang()
        restored[r.rank] = await restore(replies, r)
        assert await restore(replies, r) == restored[r.rank]  # asked again: the same answer, told once
        await r.sleep(1.0)
        return 0

    async def status(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("snapshot_restored", generation=1, rank=0)
        await seen.first("snapshot_restored", generation=1, rank=1)
        replies.status.append(daemon.commands.control("status"))
        metrics = Metrics(daemon.events, "r", "n", daemon.clock.wall)
        metrics.refresh(replies.status[-1])
        served.update({(s.name, s.labels.get("rank")): s.value for family in metrics.registry.collect()
                       for s in family.samples if s.name.startswith("ft_supervisor_snapshot")})  # fmt: skip

    run = supervise(tmp_path, trains, "--max-restarts", "1", operator=replies.operator(status))
    assert run.code == 0, run.story()
    for rank in (0, 1):
        found = restored[rank]
        assert found is not None
        step, data, answer = found
        assert step == 4 and data == content(rank, 4, 4096)
        assert answer["path"].endswith(f"rank{rank}.0") and answer["slot"] == 0
    assert modes == {0: (0o700, 0o600), 1: (0o700, 0o600)}
    # sampled: the first complete snapshot of each rank in the generation, not every step
    taken = run.named("snapshot_taken")
    assert sorted((e["generation"], e["rank"], e["step"]) for e in taken) == [(0, 0, 0), (0, 1, 0)], taken
    assert {(e["rank"], e["step"], e["source"]) for e in run.named("snapshot_restored")} == {
        (0, 4, "memory"), (1, 4, "memory"),
    }  # fmt: skip
    [whole] = replies.status
    status = whole["snapshots"]
    assert "snapshots: 16384 of " in render_status(whole)
    assert {rank: row["step"] for rank, row in status["ranks"].items()} == {"0": 4, "1": 4}
    assert status["bytes"] == 4 * 4096 and status["budget"] > 0
    assert served[("ft_supervisor_snapshot_step", "1")] == 4
    assert served[("ft_supervisor_snapshot_bytes", "0")] == 4096
    assert served[("ft_supervisor_snapshot_memory_bytes", None)] == 4 * 4096
    assert served[("ft_supervisor_snapshot_memory_budget_bytes", None)] == status["budget"]
    released = run.one("snapshots_released")
    assert (released["files"], released["bytes"]) == (4, 4 * 4096)
    assert not Path(released["directory"]).exists()  # removed with the run


def test_a_rank_dead_between_begin_and_done_restores_the_other_slot(tmp_path: Path) -> None:
    replies, restored = Replies(), {}

    async def trains(r: Rank) -> int | None:
        r.hello()
        if r.generation == 0:
            for step in range(4):
                await r.sleep(1.0)
                await snapshot(replies, r, step)
            await r.sleep(1.0)
            if r.rank == 0:
                await snapshot(replies, r, 4, done=False)  # killed mid-copy: step 3's slot is untouched
                return 1
            await snapshot(replies, r, 4)
            await r.hang()
        restored[r.rank] = await restore(replies, r)
        return 0

    run = supervise(tmp_path, trains, "--max-restarts", "1", operator=replies.operator())
    assert run.code == 0, run.story()
    for rank in (0, 1):
        found = restored[rank]
        assert found is not None
        step, data, answer = found
        # rank 1 holds step 4 as well, but rank 0 does not: the node agrees on 3
        assert (step, answer["slot"]) == (3, 1) and data == content(rank, 3, 4096), answer


def test_malformed_and_unbegun_snapshot_messages_are_dropped_and_counted(tmp_path: Path) -> None:
    replies, answers = Replies(), {}

    async def trains(r: Rank) -> int | None:
        r.hello()
        if r.rank == 0:
            await snapshot(replies, r, 1)  # slot 1 complete: nothing below may cost it
            r.send("snapshot_done", slot=1, step=9, bytes=1 << 20, checksum="ab")  # longer than its file
            answers["oversized"] = await replies.ask(r, "snapshot_begin", slot=0, bytes=1 << 60)
            answers["slot 2"] = await replies.ask(r, "snapshot_begin", slot=2, bytes=10)
            r.send("snapshot_done", slot=1, step=3, bytes=10, checksum="ab")  # never begun
            answers["begun"] = await replies.ask(r, "snapshot_begin", slot=0, bytes=100)
            r.send("snapshot_done", slot=0, step=3, bytes=101, checksum="ab")  # longer than its file
            r.send("snapshot_done", slot=0, step=3, bytes=100, checksum="not hex")
            answers["restore"] = await replies.ask(r, "snapshot_restore")
        else:
            await snapshot(replies, r, 1)
        await r.train(3)
        return 0

    run = supervise(tmp_path, trains, operator=replies.operator())
    assert run.code == 0, run.story()
    assert answers["oversized"] is None and answers["slot 2"] is None  # dropped: no answer
    assert answers["begun"] is not None and answers["begun"]["ok"]
    # the complete slot as it was, never the torn one
    restored = answers["restore"]
    assert restored is not None and (restored["step"], restored["slot"]) == (1, 1), restored
    assert {e["reason"] for e in run.named("message_dropped")} >= {"malformed", "snapshot_unbegun"}
    assert run.daemon.monitor.drops["snapshot_unbegun"] == 3
    assert run.daemon.monitor.drops["malformed"] == 3
    assert [e["step"] for e in run.named("snapshot_restored")] == [1]


def test_a_snapshot_over_the_budget_is_refused_once_and_training_goes_on(tmp_path: Path) -> None:
    replies, answers, restored = Replies(), [], []

    async def trains(r: Rank) -> int | None:
        r.hello()
        for step in range(10):
            await r.step(step)
            answers.append(await snapshot(replies, r, step, 40 << 10))  # slot 1 would make 80K of 64K
        answers.append(await snapshot(replies, r, 10, 1 << 20))  # beyond the whole budget
        restored.append(await restore(replies, r))
        return 0

    run = supervise(tmp_path, trains, "--nproc-per-node", "1", "--snapshot-memory", "64K",
                    operator=replies.operator())  # fmt: skip
    assert run.code == 0, run.story()
    assert [a["ok"] for a in answers] == [True, False] * 5 + [False]
    assert "budget of 65536" in answers[1]["why"]
    refused = run.one("snapshot_refused")
    assert (refused["rank"], refused["bytes"], refused["budget"]) == (0, 40 << 10, 64 << 10)
    # step 10 went to slot 0 and was refused: slot 0 is no longer complete; nothing else held
    assert restored == [None]
    assert run.one("generation_ended")["iteration"] == 9


def test_two_ranks_a_step_apart_restore_the_step_both_hold(tmp_path: Path) -> None:
    replies, restored = Replies(), {}

    async def trains(r: Rank) -> int | None:
        r.hello()
        last = 5 if r.rank == 0 else 4  # rank 1 is a step behind
        for step in range(last + 1):
            await r.sleep(1.0)
            await snapshot(replies, r, step, 1000 + r.rank)
        await r.sleep(5.0)
        restored[r.rank] = await restore(replies, r)
        return 0

    run = supervise(tmp_path, trains, operator=replies.operator())
    assert run.code == 0, run.story()
    for rank in (0, 1):
        found = restored[rank]
        assert found is not None
        step, data, answer = found
        assert (step, answer["slot"], answer["bytes"]) == (4, 0, 1000 + rank)
        assert data == content(rank, 4, 1000 + rank)


def test_a_generation_restores_one_step_whatever_its_ranks_snapshot_meanwhile(tmp_path: Path) -> None:
    replies, restored = Replies(), {}

    async def trains(r: Rank) -> int | None:
        r.hello()
        if r.generation == 0:
            for step in range(5):
                await r.sleep(1.0)
                await snapshot(replies, r, step)
            if r.rank == 1:
                return 1
            await r.hang()
        if r.rank == 1:
            await r.sleep(5.0)  # slow to restore: rank 0 has moved on meanwhile
        restored[r.rank] = await restore(replies, r)
        if r.rank == 0:
            for step in (5, 6):  # step 6 overwrites slot 0, which held the step it restored
                await r.sleep(1.0)
                await snapshot(replies, r, step)
        await r.sleep(6.0)
        return 0

    run = supervise(tmp_path, trains, "--max-restarts", "1", operator=replies.operator())
    assert run.code == 0, run.story()
    # rank 0 now holds 5 and 6, rank 1 still 3 and 4: the generation's answer stays 4
    assert {rank: None if found is None else found[0] for rank, found in restored.items()} == {0: 4, 1: 4}


def test_a_stale_directory_of_a_dead_daemon_is_removed_at_start() -> None:
    token = secrets.token_hex(4)
    stale, live = SHM / f"ft-supervisor-1-{token}", SHM / f"ft-supervisor-2-{token}"
    for directory in (stale, live):
        directory.mkdir(mode=0o700)
        (directory / "rank0.0").write_bytes(b"x")
    held = _locked(live / LOCK)  # what a live daemon holds, whatever its pid namespace
    try:
        removed = remove_stale()
        assert stale in removed and live not in removed
        assert not stale.exists() and live.exists()
    finally:
        assert held is not None
        os.close(held)
        shutil.rmtree(live)


@contextlib.contextmanager
def small_shm(where: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes at ``where`` (root only), unmounted at the end."""
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                             capture_output=True, text=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def fill(directory: Path) -> None:
    """Something else takes what is left of the shared memory."""
    st = os.statvfs(directory)
    fd = os.open(directory / "filler", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize)
    finally:
        os.close(fd)


def on(root: Path, then: Operator | None = None) -> Operator:
    """The daemon's snapshots held under ``root`` instead of /dev/shm."""

    async def act(daemon: Supervisor, seen: Watcher) -> None:
        daemon.snapshots = HeldSnapshots(
            daemon.events, daemon.clock, budget=None, token=daemon.token, root=root
        )
        daemon.monitor.snapshots.handler = daemon.snapshots.handle
        if then is not None:
            await then(daemon, seen)

    return act


def test_a_slot_is_reserved_before_its_begin_is_answered_and_no_room_is_a_refusal(tmp_path: Path) -> None:
    replies, answers, restored = Replies(), [], []

    async def trains(r: Rank) -> int | None:
        r.hello()
        answers.append(await snapshot(replies, r, 0, 64 << 10))
        fill(shm)  # after the budget check of every slot to come (256K)
        answers.append(await snapshot(replies, r, 1, 64 << 10))  # slot 1 finds no room: refused
        restored.append(await restore(replies, r))  # slot 0 as it was
        # slot 0's pages were reserved at its begin: they are the rank's, however full /dev/shm is
        answers.append(await snapshot(replies, r, 2, 64 << 10))
        await r.train(3)
        return 0

    with small_shm(tmp_path / "shm", 256 << 10) as shm:
        run = supervise(tmp_path, trains, "--nproc-per-node", "1", operator=replies.operator(on(shm)))
        assert run.code == 0, run.story()
        assert [a["ok"] for a in answers] == [True, False, True], answers
        assert "no room left for 65536 bytes for slot 1" in answers[1]["why"], answers
        refused = run.one("snapshot_refused")
        assert (refused["rank"], refused["bytes"]) == (0, 64 << 10) and "no room" in refused["why"]
        [found] = restored
        assert found is not None and found[0] == 0 and found[1] == content(0, 0, 64 << 10)
        assert run.one("generation_ended")["iteration"] == 2


def test_a_begin_asked_again_while_its_slot_is_reserved_gets_the_same_slot(tmp_path: Path) -> None:
    replies, answers = Replies(), []

    async def trains(r: Rank) -> int | None:
        r.hello()
        # the rank gave up waiting and asks again: one reservation, both answered after it
        answers.extend(await asyncio.gather(*(replies.ask(r, "snapshot_begin", slot=0, bytes=8 << 20)
                                              for _ in range(2))))  # fmt: skip
        await r.train(1)
        return 0

    run = supervise(tmp_path, trains, "--nproc-per-node", "1", operator=replies.operator())
    assert run.code == 0, run.story()
    assert [a is not None and a["ok"] for a in answers] == [True, True], answers
    assert answers[0] == answers[1]
    assert run.one("snapshots_released")["bytes"] == 8 << 20  # counted once
