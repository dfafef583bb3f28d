"""``client.snapshot`` / ``client.restore`` through a real daemon: two lock-stepped ranks
snapshot every step; rank 1 dies right after a snapshot, or in the middle of copying one
into its slot; the restarted ranks restore the newest step both hold complete, bit for bit,
and go on from the next; warm standbys restore from the slots they mapped before their go
(the premap itself: tests/unit/test_standby_premap.py). The daemon's side
on virtual time (begin/done bookkeeping, the budget, malformed requests) is in
tests/fast/test_held_snapshots.py; the slot format in tests/unit/test_snapshot_slots.py."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import RANKS, Daemon, rank_pids, wait_until

SNAPSHOTTING = str(RANKS / "snapshotting.py")
Start = Callable[..., Daemon]


def _restored(out: Path, gen: int, world: int = 2) -> list[dict[str, Any]]:
    return [json.loads((out / f"g{gen}.r{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_failed_rank_loses_at_most_one_step(start: Start, tmp_path: Path, how: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    kill_at = 12
    d = start("--nproc-per-node", "2", "--preload", "none", "--max-restarts", "1", SNAPSHOTTING,
              "--steps", "20", "--out", str(out), "--kill-at", str(kill_at), "--how", how)  # fmt: skip
    assert d.wait(90) == 0, d.story()
    assert _restored(out, 0) == [{"step": None, "same": None}] * 2  # nothing held before the first step
    after = _restored(out, 1)
    steps = {r["step"] for r in after}
    assert len(steps) == 1, after  # both ranks restore the same step
    (step,) = steps
    # a SIGKILL may cut off the last snapshot's done (an exception's exit sends it first), and
    # the peer's, stopped by SIGTERM, may be cut off either way on a loaded machine
    assert step in (kill_at - 1, kill_at), after
    assert all(r["same"] is True for r in after), after
    # the restored state, kept while the next two snapshots overwrite both slots, is intact
    assert all(r["kept"] is True for r in after), after
    restored = d.events("snapshot_restored")
    assert {(e["rank"], e["step"]) for e in restored} == {(0, step), (1, step)}, restored
    assert all(e["source"] == "memory" and e["generation"] == 1 for e in restored)


@pytest.mark.torch
def test_torch_tensors_come_back_bit_for_bit(start: Start, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    d = start("--nproc-per-node", "2", "--max-restarts", "1", SNAPSHOTTING,
              "--steps", "8", "--out", str(out), "--kill-at", "5", "--how", "raise", "--torch")  # fmt: skip
    assert d.wait(120) == 0, d.story()
    # the peer's last done may be cut off by its SIGTERM (a loaded machine): at most one step back
    after = _restored(out, 1)
    step = after[0]["step"]
    assert step in (4, 5) and after == [{"step": step, "same": True, "kept": True}] * 2, after


def test_a_snapshot_over_the_budget_is_refused_and_training_goes_on(start: Start, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    d = start("--nproc-per-node", "2", "--preload", "none", "--snapshot-memory", "16K", SNAPSHOTTING,
              "--steps", "10", "--out", str(out), "--refusals")  # fmt: skip
    assert d.wait(60) == 0, d.story()
    assert [r["refused"] for r in _restored(out, 0)] == [10, 10]  # every step refused, none failed
    # one line per rank on its stderr, not one per step
    lines = [line for line in d.stderr().splitlines() if "refused by the daemon" in line]
    assert len(lines) == 2, lines


def test_a_damaged_slot_is_not_restored(start: Start, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    d = start("--nproc-per-node", "2", "--preload", "none", "--max-restarts", "1", SNAPSHOTTING,
              "--steps", "10", "--out", str(out), "--kill-at", "5", "--how", "raise",
              "--corrupt")  # fmt: skip
    assert d.wait(60) == 0, d.story()
    rank0, rank1 = _restored(out, 1)
    # the peer's last done may be cut off by its SIGTERM (a loaded machine): at most one step back
    assert rank0["step"] in (4, 5) and rank0["same"] is True, rank0
    assert rank1 == {"step": None, "same": None}  # checked before use: nothing rather than a damaged state
    said = f"restore of step {rank0['step']} refused"
    lines = [line for line in d.stderr().splitlines() if said in line]
    assert len(lines) == 1 and "checksum" in lines[0], d.story()


@pytest.mark.torch
def test_a_rank_killed_mid_copy_restores_the_other_slot(start: Start, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    kill_at = 5
    # torch's preload (the default): the fork server imports it once, not each rank of each generation
    d = start("--nproc-per-node", "2", "--max-restarts", "1", SNAPSHOTTING,
              "--steps", "8", "--out", str(out), "--kill-at", str(kill_at), "--torch", "--torn")  # fmt: skip
    assert d.wait(120) == 0, d.story()
    rank0, rank1 = _restored(out, 1)
    # the copy of step 5 had begun when the SIGKILL came: its slot's header says 5, the other 4
    assert sorted(rank1.pop("headers")) == [kill_at - 1, kill_at], rank1
    # slot of step 5 begun, never complete: both ranks restore 4 from the other slot, intact
    assert rank0 == rank1 == {"step": kill_at - 1, "same": True, "kept": True}, (rank0, rank1)
    [killed] = [e for e in d.events("rank_exited") if e["generation"] == 0 and e["rank"] == 1]
    assert killed["signal"] == "SIGKILL", killed


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def _mapped(pid: int) -> set[tuple[str, str]]:
    """(permissions, file name) of each file ``pid`` maps."""
    rows = [line.split() for line in _maps(pid).splitlines()]
    return {(row[1], "/" + row[5].rpartition("/")[2]) for row in rows if len(row) >= 6}


def _kept(out: Path, gen: int) -> list[dict[str, Any]] | None:
    """Both ranks' files once final: written again, with ``kept``, two snapshots after the restore."""
    try:
        records = _restored(out, gen)
    except (OSError, ValueError):  # not there yet, or being written
        return None
    return records if all("kept" in r for r in records) else None


def test_standbys_restore_from_the_slots_they_mapped_before_their_go(start: Start, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    d = start("--nproc-per-node", "2", "--preload", "none", "--max-restarts", "1", SNAPSHOTTING,
              "--steps", "100000", "--step-time", "0.02", "--out", str(out), "--served")  # fmt: skip
    spawned = d.wait_event("rank_spawned", where=lambda e: e["generation"] == 1, count=2, timeout=60)
    # each standby maps its own rank's two slot files while it waits, and no other rank's:
    # copy-on-write for its restore, shared and writable for its first snapshots
    for e in spawned:
        rank, pid = e["rank"], e["pid"]
        mine = {(perms, f"/rank{rank}.{slot}") for perms in ("rw-p", "rw-s") for slot in (0, 1)}
        wait_until(lambda pid=pid, mine=mine: mine <= _mapped(pid), 60, f"standby {rank} maps")
        assert f"/rank{1 - rank}." not in _maps(pid)
    # still waiting for their go: what mapped the slots is the standbys, not running ranks
    assert not d.events("generation_started")[1:], d.story()
    os.kill(rank_pids(d, 0)[1], signal.SIGKILL)
    after = wait_until(lambda: _kept(out, 1), 60, "generation 1 restored")
    d.signal(signal.SIGTERM)
    assert d.wait(60) == 128 + signal.SIGTERM, d.story()
    steps = {r["step"] for r in after}
    assert len(steps) == 1 and None not in steps, after  # both ranks restore one step
    assert all(r["same"] is True and r["kept"] is True and r["served"] == "premapped" for r in after), after
    # the first two snapshots after the go wrote through the standby's mappings
    assert all(r["writers"] == ["premapped", "premapped"] for r in after), after
