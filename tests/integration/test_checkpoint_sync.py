"""Checkpoint sync through the whole daemon: a run killed mid-way resumes, on a fresh
LOCAL, from the checkpoint copied back from DEST; the settle time is judged on real
mtimes. The last sync at the end (normal or SIGTERM) and retention run through the
daemon's loop in tests/fast/test_checkpoints.py."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

from tests.support import RANKS, Daemon

RANK = str(RANKS / "checkpointing.py")
FAST = ("--nproc-per-node", "1", "--preload", "none")
Start = Callable[..., Daemon]


def sync_args(local: Path, dest: Path, *extra: str) -> tuple[str, ...]:
    return ("--checkpoint-path", str(local), "--checkpoint-url", str(dest), *extra)


def committed(dest: Path) -> set[str]:
    """The entries under a real name at DEST, each checked complete (it parses, whole)."""
    names = {p.name for p in dest.iterdir() if not p.name.startswith(".ft-")}
    for name in names:
        body = json.loads((dest / name).read_text())
        assert body["step"] == int(name[5:11]), name
    manifest = json.loads((dest / ".ft-checkpoints.json").read_text())["entries"]
    # a kill between an entry's rename and the manifest's rewrite leaves one more name
    assert set(manifest) <= names
    return names


def test_a_killed_run_resumes_on_an_empty_local_from_the_copy_back(start: Start, tmp_path: Path) -> None:
    dest, record = tmp_path / "dest", tmp_path / "resumed.txt"
    periodic = ("--checkpoint-frequency", "0.2", "--checkpoint-settle", "0.1")
    first = start(
        *FAST,
        *sync_args(tmp_path / "local1", dest, *periodic),
        RANK,
        "--dir",
        str(tmp_path / "local1"),
        "--every",
        "3",
        "--record",
        str(record),
    )
    # more than one entry synced: what is copied back must be the newest, not any
    first.wait_event("checkpoint_synced", where=lambda e: e["entries"] and not e["final"], count=2)
    first.signal(signal.SIGKILL)  # no final sync: DEST has what the periodic ones sent
    first.wait()
    synced = sorted(committed(dest))
    newest = int(synced[-1][5:11])

    second = start(
        *FAST,
        *sync_args(tmp_path / "local2", dest, *periodic),
        RANK,
        "--dir",
        str(tmp_path / "local2"),
        "--every",
        "3",
        "--record",
        str(record),
        "--steps",
        str(newest + 4),
    )
    assert second.wait() == 0, second.stderr()
    restored = second.events("checkpoint_restored")
    assert [(e["entry"], e["files"], e["source"]) for e in restored] == [(synced[-1], 1, str(dest))]
    assert record.read_text().splitlines() == ["resumed -1", f"resumed {newest}"]
    assert f"resumed from step {newest}" in second.stdout()
    # copy-back before the script ran, the last sync after the ranks were gone
    names = [e["event"] for e in second.events()]
    assert names.index("checkpoint_restored") < names.index("generation_started")
    final = second.events("checkpoint_synced")[-1]
    last_sync = len(names) - 1 - names[::-1].index("checkpoint_synced")  # periodic ones may come before
    assert final["final"] and names.index("generation_ended") < last_sync
    after = committed(dest)
    assert f"step_{newest + 3:06d}.json" in after
    assert not [p for p in dest.iterdir() if p.name.startswith(".ft-tmp.")]  # the kill's leftovers cleaned
    # what was copied back is not sent again
    assert all(synced[-1] not in e["entries"] for e in second.events("checkpoint_synced"))


def test_a_checkpoint_replaced_by_rename_more_often_than_the_settle_time_is_uploaded(
    start: Start, tmp_path: Path
) -> None:
    # issue 12: replaced every 20 ms, the entry never settled, every sync said busy and
    # DEST stayed empty, so a SIGKILL lost everything. Now the file held open is
    # uploaded once it went unwritten for the settle time
    local, dest = tmp_path / "local", tmp_path / "dest"
    d = start(*FAST, *sync_args(local, dest, "--checkpoint-frequency", "0.2", "--checkpoint-settle", "2"),
              RANK, "--dir", str(local), "--snapshot", "rename", "--step-time", "0.02")  # fmt: skip
    synced = d.wait_event("checkpoint_synced", where=lambda e: "snapshot.json" in e["entries"], timeout=15)
    d.signal(signal.SIGKILL)
    d.wait()
    body = json.loads((dest / "snapshot.json").read_text())  # whole: it parses
    assert body["step"] >= 0 and len(body["pad"]) == 65536
    assert synced[0]["files"] == 1 and synced[0]["bytes"] == (dest / "snapshot.json").stat().st_size


def test_a_checkpoint_rewritten_in_place_still_waits_to_settle(start: Start, tmp_path: Path) -> None:
    # the same file rewritten in place is complete only once its writer pauses: a copy
    # made between two of its writes would be torn
    local, dest = tmp_path / "local", tmp_path / "dest"
    d = start(*FAST, *sync_args(local, dest, "--checkpoint-frequency", "0.2", "--checkpoint-settle", "2"),
              RANK, "--dir", str(local), "--snapshot", "in-place", "--step-time", "0.02")  # fmt: skip
    d.wait_event("checkpoint_synced", where=lambda e: e["busy"] == ["snapshot.json"], count=3, timeout=15)
    d.signal(signal.SIGKILL)
    d.wait()
    assert not any(e["entries"] for e in d.events("checkpoint_synced"))
    assert not (dest / "snapshot.json").exists()
