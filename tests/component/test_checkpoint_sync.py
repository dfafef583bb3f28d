"""The checkpoint syncer on real directories (and fsspec's memory and local
filesystems): what it sends, keeps and copies back, and that a sync killed mid-copy
never leaves a partial checkpoint at DEST."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from supervisor.checkpoints.remote import FsspecStore
from supervisor.checkpoints.store import Maker, Store
from supervisor.checkpoints.sync import CheckpointSync
from supervisor.checkpoints.threads import DaemonThreads
from supervisor.clock import Clock
from supervisor.config.checkpoints import CheckpointConfig
from supervisor.runtime.records.events import EventLog
from tests.support import wait_until

SEC = 1_000_000_000
MANIFEST = ".ft-checkpoints.json"


class Rig:
    """A LOCAL directory and a DEST (a directory, or a memory:// URL), with the events."""

    def __init__(self, tmp: Path, kind: str) -> None:
        self.tmp = tmp
        self.kind = kind
        self.dest = str(tmp / "dest") if kind == "local" else f"memory://ckpt-{uuid.uuid4().hex}"
        self.events_path = tmp / "events.jsonl"
        self.log = EventLog(self.events_path, logging.getLogger("test"), Clock())

    def syncer(self, local: Path, **cfg: Any) -> CheckpointSync:
        cfg.setdefault("settle", 0.0)
        return CheckpointSync(CheckpointConfig(path=local, url=self.dest, **cfg), self.log, chunk=64 << 10)

    def events(self, name: str) -> list[dict[str, Any]]:
        lines = self.events_path.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == name]

    def dest_names(self) -> set[str]:
        if self.kind == "local":
            return {p.name for p in Path(self.dest).iterdir()}
        fs, root = fsspec.core.url_to_fs(self.dest)
        with contextlib.suppress(FileNotFoundError):
            return {p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)}
        return set()

    def manifest(self) -> dict[str, Any]:
        if self.kind == "local":
            raw = (Path(self.dest) / MANIFEST).read_bytes()
        else:
            fs, root = fsspec.core.url_to_fs(self.dest)
            raw = fs.cat_file(f"{root}/{MANIFEST}")
        entries: dict[str, Any] = json.loads(raw)["entries"]
        return entries


@pytest.fixture(params=["local", "memory"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Rig:
    return Rig(tmp_path, request.param)


def write(path: Path, data: bytes, mtime_s: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_s is not None:
        os.utime(path, ns=(int(mtime_s * SEC), int(mtime_s * SEC)))


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root``: its bytes and mtime_ns."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


async def restore(cs: CheckpointSync) -> None:
    task = asyncio.create_task(cs.run())
    await asyncio.wait_for(cs.restored.wait(), 10)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.mark.asyncio
async def test_sends_what_changed_and_copies_the_newest_back_as_it_was(rig: Rig, tmp_path: Path) -> None:
    local = tmp_path / "local"
    write(local / "snapshot.pth", os.urandom(1 << 20), mtime_s=1000)
    write(local / "step_000002" / "model.pt", os.urandom(3 << 20), mtime_s=2000)
    write(local / "step_000002" / "sub" / "optim.pt", b"o" * 1000, mtime_s=2001)
    cs = rig.syncer(local)
    await restore(cs)
    assert [e["reason"] for e in rig.events("checkpoint_restore_skipped")] == ["dest_empty"]
    assert await cs.sync(final=False)
    assert await cs.sync(final=False)  # nothing changed: nothing sent, no event
    synced = rig.events("checkpoint_synced")
    assert [(e["entries"], e["files"], e["bytes"]) for e in synced] == [
        (["step_000002", "snapshot.pth"], 3, (1 << 20) + (3 << 20) + 1000)
    ]
    assert set(rig.manifest()) == {"step_000002", "snapshot.pth"}
    assert rig.dest_names() == {"step_000002", "snapshot.pth", MANIFEST}

    # a fresh LOCAL gets the newest entry, bytes and times as they were, and sends nothing back
    fresh = tmp_path / "fresh"
    again = rig.syncer(fresh)
    await restore(again)
    assert tree(fresh) == {f"step_000002/{k}": v for k, v in tree(local / "step_000002").items()}
    restored = rig.events("checkpoint_restored")
    assert [(e["entry"], e["files"], e["source"]) for e in restored] == [("step_000002", 2, rig.dest)]
    await again.final()
    assert rig.events("checkpoint_synced")[-1]["entries"] == []

    # a changed entry is sent again, whole, and is then the newest
    write(local / "snapshot.pth", b"newer", mtime_s=3000)
    assert await cs.sync(final=False)
    assert rig.events("checkpoint_synced")[-1]["entries"] == ["snapshot.pth"]
    third = tmp_path / "third"
    await restore(rig.syncer(third))
    assert tree(third) == {"snapshot.pth": (b"newer", 3000 * SEC)}
    await cs.final()


@pytest.mark.asyncio
async def test_copy_back_keeps_what_local_has(rig: Rig, tmp_path: Path) -> None:
    first = tmp_path / "first"
    write(first / "snapshot.pth", b"version 2", mtime_s=2000)
    cs = rig.syncer(first)
    await restore(cs)
    await cs.final()
    stale = tmp_path / "stale"
    write(stale / "snapshot.pth", b"version 1", mtime_s=1000)
    cs = rig.syncer(stale)
    await restore(cs)
    assert rig.events("checkpoint_restore_skipped")[-1]["reason"] == "local_has_it"
    await cs.final()  # nor does the older LOCAL version replace DEST's newer one
    assert (stale / "snapshot.pth").read_bytes() == b"version 1"
    assert rig.manifest()["snapshot.pth"]["files"] == [["", 9, 2000 * SEC]]
    assert rig.events("checkpoint_synced")[-1]["entries"] == []


@pytest.mark.asyncio
async def test_retention_keeps_the_k_newest_at_dest_and_never_touches_local(rig: Rig, tmp_path: Path) -> None:
    local = tmp_path / "local"
    for step in range(4):
        write(local / f"step_{step}", f"{step}".encode(), mtime_s=1000 + step)
    cs = rig.syncer(local, keep=2)
    await restore(cs)
    assert await cs.sync(final=False)
    assert set(rig.manifest()) == {"step_2", "step_3"}  # the older two are not even sent
    assert rig.events("checkpoint_pruned") == []
    write(local / "step_4", b"4", mtime_s=1004)
    assert await cs.sync(final=False)
    assert set(rig.manifest()) == {"step_3", "step_4"}
    assert rig.dest_names() == {"step_3", "step_4", MANIFEST}
    assert [e["entries"] for e in rig.events("checkpoint_pruned")] == [["step_2"]]
    assert sorted(p.name for p in local.iterdir()) == [f"step_{i}" for i in range(5)]
    await cs.final()


@pytest.mark.asyncio
async def test_an_entry_written_to_during_its_copy_is_not_put_in_place(rig: Rig, tmp_path: Path) -> None:
    local = tmp_path / "local"
    big = local / "big.bin"
    write(big, os.urandom(4 << 20), mtime_s=1000)
    cs = rig.syncer(local)
    await restore(cs)

    async def writer() -> None:  # appends once the copy has begun (a chunk per loop turn)
        while not any(n.startswith(".ft-tmp.") for n in rig.dest_names()):
            await asyncio.sleep(0)
        with big.open("ab") as f:
            f.write(b"more")

    appended = asyncio.create_task(writer())
    assert await cs.sync(final=False)
    await asyncio.wait_for(appended, 5)
    assert rig.events("checkpoint_synced")[-1]["busy"] == ["big.bin"]
    assert rig.dest_names() <= {MANIFEST}  # neither the entry nor its temporary copy
    await cs.final()
    assert rig.events("checkpoint_synced")[-1]["entries"] == ["big.bin"]
    fresh = tmp_path / "fresh"
    await restore(rig.syncer(fresh))
    assert (fresh / "big.bin").read_bytes() == big.read_bytes()


CRASH = """
import asyncio, logging, sys, time
from pathlib import Path
from tests.component.test_checkpoint_sync import crash_syncer

async def busy_loop():
    # a loaded daemon: each chunk of the copy waits a while for the loop
    while True:
        time.sleep(0.01)
        await asyncio.sleep(0)

async def main():
    cs = crash_syncer(*sys.argv[1:])
    asyncio.get_running_loop().create_task(busy_loop())
    await cs.sync(final=True)

asyncio.run(main())
"""


def crash_syncer(kind: str, local: str, dest: str, events: str) -> CheckpointSync:
    """The syncer both the process that is killed and the one after it use."""
    executor = DaemonThreads()
    store: Store | None = None
    if kind == "fsspec":  # fsspec's own local filesystem: a rename per object, as on a bucket
        fs = fsspec.filesystem("file")
        store = FsspecStore(fs, dest, url=dest, executor=executor, maker=Maker.here(), chunk=64 << 10)
    cfg = CheckpointConfig(path=Path(local), url=dest, settle=0.0)
    log = EventLog(Path(events), logging.getLogger("crash"), Clock())
    return CheckpointSync(cfg, log, chunk=64 << 10, store=store, executor=executor)


@pytest.mark.parametrize(("kind", "entry"), [("local", "file"), ("local", "dir"), ("fsspec", "dir")])
@pytest.mark.asyncio
async def test_a_sync_killed_mid_copy_leaves_no_partial_checkpoint(
    tmp_path: Path, kind: str, entry: str
) -> None:
    local, dest = tmp_path / "local", tmp_path / "dest"
    big_data = os.urandom(16 << 20)
    big = local / "big.bin" if entry == "file" else local / "step_000100" / "big.bin"
    write(big, big_data, mtime_s=1000)  # older: copied after the small one is in place
    if entry == "dir":
        write(local / "step_000100" / "meta.json", b"{}", mtime_s=999)
    write(local / "small.bin", b"small", mtime_s=2000)
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    repo = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(
        [sys.executable, str(script), kind, str(local), str(dest), str(tmp_path / "events1.jsonl")],
        env=dict(os.environ, PYTHONPATH=repo),
    )
    try:

        def partial_copy() -> bool:
            temps = list(dest.glob(f".ft-tmp.*.{big.relative_to(local).parts[0]}"))
            inner = [p / "big.bin" if p.is_dir() else p for p in temps]
            return any(p.exists() and 0 < p.stat().st_size < len(big_data) for p in inner)

        wait_until(partial_copy, 30, "the subprocess to be half-way through copying big.bin")
    finally:
        proc.kill()
        proc.wait(10)
    complete = {p.name for p in dest.iterdir() if not p.name.startswith(".ft-")}
    assert complete == {"small.bin"}  # never a partial checkpoint under its name
    assert set(json.loads((dest / MANIFEST).read_text())["entries"]) == {"small.bin"}
    assert list(dest.glob(".ft-tmp.*"))  # the killed copy's leftover

    cs = crash_syncer(kind, str(local), str(dest), str(tmp_path / "events2.jsonl"))
    assert await cs.sync(final=True)
    assert not list(dest.glob(".ft-tmp.*"))  # cleaned: a dead process's, on this host
    assert set(json.loads((dest / MANIFEST).read_text())["entries"]) == {
        "small.bin",
        big.relative_to(local).parts[0],
    }
    assert (dest / big.relative_to(local)).read_bytes() == big_data


class HungFS(MemoryFileSystem):
    """An object store whose uploads never return (a network that went quiet)."""

    gate = threading.Event()

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "w" in mode and ".ft-tmp." in path and MANIFEST not in path:
            self.gate.wait()
        return super()._open(path, mode, **kwargs)


@pytest.mark.asyncio
async def test_the_last_sync_gives_up_at_its_deadline_on_a_hung_destination(tmp_path: Path) -> None:
    local = tmp_path / "local"
    write(local / "snapshot.pth", b"x" * 1000, mtime_s=1000)
    executor = DaemonThreads()
    store = FsspecStore(HungFS(), f"/hung-{uuid.uuid4().hex}", url="hung://", executor=executor,
                        maker=Maker.here())  # fmt: skip
    log = EventLog(tmp_path / "events.jsonl", logging.getLogger("test"), Clock())
    cfg = CheckpointConfig(path=local, url="hung://", settle=0.0, final_timeout=0.3)
    cs = CheckpointSync(cfg, log, store=store, executor=executor)
    try:
        await asyncio.wait_for(cs.final(), 5)  # the upload's thread stays stuck; we do not
    finally:
        HungFS.gate.set()
    failed = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["phase"], e["error"]) for e in failed] == [
        ("checkpoint_sync_failed", "final", "the last sync did not finish within 0.3s")
    ]


class HungReadFS(MemoryFileSystem):
    """An object store whose downloads never return; listing and the manifest still work."""

    gate = threading.Event()

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" in mode and MANIFEST not in path:
            self.gate.wait()
        return super()._open(path, mode, **kwargs)


@pytest.mark.asyncio
async def test_a_copy_back_that_hangs_gives_up_at_its_deadline_and_lets_the_ranks_start(
    tmp_path: Path,
) -> None:
    root, executor = f"/hung-read-{uuid.uuid4().hex}", DaemonThreads()
    log = EventLog(tmp_path / "events.jsonl", logging.getLogger("test"), Clock())
    # DEST holds a complete entry (MemoryFileSystem instances share one store)
    first = tmp_path / "first"
    write(first / "snapshot.pth", b"x" * 1000, mtime_s=1000)
    seed = FsspecStore(MemoryFileSystem(), root, url="mem://", executor=executor, maker=Maker.here())
    sender = CheckpointSync(CheckpointConfig(path=first, url="mem://", settle=0.0), log, store=seed,
                            executor=executor)  # fmt: skip
    assert await sender.sync(final=True)
    hung = FsspecStore(HungReadFS(), root, url="mem://", executor=executor, maker=Maker.here())
    cfg = CheckpointConfig(path=tmp_path / "empty", url="mem://", restore_timeout=0.3)
    cs = CheckpointSync(cfg, log, store=hung, executor=executor)
    task = asyncio.create_task(cs.run())
    try:
        await asyncio.wait_for(cs.restored.wait(), 5)  # the download's thread stays stuck; we do not
    finally:
        task.cancel()
        HungReadFS.gate.set()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e.get("phase"), e.get("error")) for e in events][-1] == (
        "checkpoint_sync_failed", "restore", "the copy-back did not finish within 0.3s"
    )
    assert not (tmp_path / "empty" / "snapshot.pth").exists()
    executor.shutdown()
