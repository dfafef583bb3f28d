"""A rank killed after its copy but before its done (its checksum and message go from a
background thread): the daemon records the slot from the header's seal.

In DDP that window is a step long: rank 1 copied step 4 and is killed in step 5's backward
after its gradients went out; rank 0 completes step 5 and overwrites its step 3. Rank 0 holds
{4, 5}, rank 1 holds {3} and an unrecorded 4: without the seal no step is common and the job
goes back to its disk checkpoint; with it, both restore step 4.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import xxhash

from supervisor.core.memory_snapshots import HEADER, HEADER_SIZE, MAGIC, SEAL
from tests.fast.fakes import Rank
from tests.fast.harness import supervise
from tests.fast.test_held_snapshots import Replies, content, snapshot

SIZE = 4096


def slot_bytes(rank: int, step: int, *, sealed: bool) -> bytes:
    """A slot as the client lays it out: the header (sealed once the copy is whole), then data."""
    header = HEADER.pack(MAGIC, 0, HEADER_SIZE, step)
    header += SEAL.pack(step + 1, SIZE) if sealed else bytes(SEAL.size)
    return header.ljust(HEADER_SIZE, b"\0") + content(rank, step, SIZE - HEADER_SIZE)


async def copied_not_done(replies: Replies, r: Rank, step: int, *, sealed: bool) -> None:
    """Begin, copy the whole slot (sealed or cut off before the seal), and die before the done."""
    answer = await replies.ask(r, "snapshot_begin", slot=step % 2, bytes=SIZE)
    assert answer is not None and answer["ok"], answer
    Path(answer["path"]).write_bytes(slot_bytes(r.rank, step, sealed=sealed))


def run_ddp_window(tmp_path: Path, *, sealed: bool) -> dict[int, Any]:
    replies, restored = Replies(), {}

    async def trains(r: Rank) -> int | None:
        r.hello()
        if r.generation == 0:
            for step in range(4):
                await r.sleep(1.0)
                await snapshot(replies, r, step, SIZE)
            await r.sleep(1.0)
            if r.rank == 1:
                await copied_not_done(replies, r, 4, sealed=sealed)
                await r.sleep(1.0)  # its step 5 gradients reach rank 0, which completes step 5
                return -9  # killed in step 5's backward, its done of step 4 never sent
            await snapshot(replies, r, 4, SIZE)
            await r.sleep(0.5)
            await snapshot(replies, r, 5, SIZE)  # its step 3 is gone
            await r.hang()
        answer = await replies.ask(r, "snapshot_restore")
        restored[r.rank] = answer
        if answer is not None and answer["step"] is not None:
            data = Path(answer["path"]).read_bytes()[: answer["bytes"]]
            restored[r.rank] = {**answer, "verified": xxhash.xxh3_64_hexdigest(data) == answer["checksum"]}
        return 0

    run = supervise(tmp_path, trains, "--max-restarts", "1", operator=replies.operator())
    assert run.code == 0, run.story()
    restored["events"] = run.named("snapshot_taken")
    return restored


def test_a_rank_killed_between_its_copy_and_its_done_still_holds_that_step(tmp_path: Path) -> None:
    restored = run_ddp_window(tmp_path, sealed=True)
    assert [restored[r]["step"] for r in (0, 1)] == [4, 4], restored
    assert restored[1]["verified"] and restored[1]["slot"] == 0  # the daemon's checksum is the client's
    sealed = [e for e in restored["events"] if e.get("sealed")]
    assert [(e["generation"], e["rank"], e["step"]) for e in sealed] == [(0, 1, 4)]


def test_a_copy_cut_off_before_its_seal_is_never_recorded(tmp_path: Path) -> None:
    restored = run_ddp_window(tmp_path, sealed=False)
    # rank 1 holds only step 3, rank 0 steps 4 and 5: nothing in common, nothing mixed
    assert [restored[r]["step"] for r in (0, 1)] == [None, None], restored
    assert not [e for e in restored["events"] if e.get("sealed")]
