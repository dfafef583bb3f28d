"""The measuring loop of scripts/bench/snapshots.py: a 200 ms step (matrix products, the
first tensor of the state updated), with and without a snapshot of the state after each
step, interleaved in rounds; then the restore of the largest state.

Under a daemon (``ft-supervisor run``) it calls ``client.snapshot`` / ``client.restore``;
run by hand, the slot layer (``supervisor.client.snapshot_slots``) in this process: the
same flattening, copy into a mapped slot file in /dev/shm and background checksum, minus
the round trip to a daemon and its records. ``--json PATH`` writes what it measured.
``--no-snapshots``: the same steps without a snapshot (the daemon's memory without them).
After each size, under a daemon, the host RAM its two slot files hold (tmpfs pages in
/dev/shm, shared with the rank's mapping: counted once). The slot layer's restore is timed
both ways, ``RESTORE_REPEATS`` times each, interleaved: mapped by the restore (as a rank
spawned cold does), and from the mapping a warm standby made while it waited for its go
(``supervisor/process/bootstrap_premap.py``, loaded as the bootstrap loads it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from supervisor import client
from supervisor.client import snapshot_slots as slotfile
from supervisor.client import snapshots
from supervisor.core.topology import ENV_PREMAP
from supervisor.process import bootstrap

MB = 1 << 20
RESTORE_STEP = 10**9
RESTORE_REPEATS = 9


def make_state(nbytes: int, device: str = "cpu") -> dict[str, Any]:
    """A model's and an optimizer's state of about ``nbytes`` (float32: the weights and
    Adam's two moments, a third each; 12 GB is a model of a billion parameters), on ``device``."""
    n = nbytes // 4 // 10  # float32 elements per block: model, exp_avg, exp_avg_sq, 10 blocks
    blocks = 10
    per = n // 3
    rows = per // 1024
    model = {f"layer{i}.weight": torch.randn(rows, 1024, device=device) for i in range(blocks)}
    optim = {i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(rows, 1024, device=device),
                 "exp_avg_sq": torch.zeros(rows, 1024, device=device)} for i in range(blocks)}  # fmt: skip
    return {
        "model": model,
        "optim": {
            "state": optim,
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": list(range(blocks))}],
        },
        "loader": {"epoch": 0, "position": 0},
        "rng": torch.get_rng_state(),
    }


def state_bytes(state: dict[str, Any]) -> int:
    return slotfile.plan(state).total


class SlotLayer:
    """What ``client.snapshot`` does after the daemon's answer, on slot files of our own."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.writers: list[slotfile.Writer | None] = [None, None]
        self.idle = [threading.Event(), threading.Event()]
        for e in self.idle:
            e.set()
        self.next = 0
        self.checksums: list[float] = []

    def snapshot(self, state: dict[str, Any], step: int) -> bool:
        p = slotfile.plan(state)
        number = self.next
        self.idle[number].wait(60)
        writer = self.writers[number]
        if writer is None or len(writer.mapping) < p.total:
            path = self.directory / f"rank0.{number}"
            with path.open("ab") as f:  # the daemon's part: the file grown to the size asked
                f.truncate(max(p.total, f.tell()))
            if writer is not None:
                writer.close()
            writer = self.writers[number] = slotfile.Writer(slotfile.map_for_writing(str(path), p.total))
        copying = writer.write(p, step)
        self.idle[number].clear()
        job = (number, writer, p.total, step, copying)
        threading.Thread(target=self._finish, args=job, daemon=True).start()
        self.next = 1 - number
        return True

    def _finish(self, number: int, writer: slotfile.Writer, nbytes: int, step: int, copying: Any) -> None:
        if copying is not None:  # the device's copies, then the seal: as the client's background thread
            copying.wait()
            writer.seal(nbytes, step)
        began = time.perf_counter()
        slotfile.checksum(writer.mapping, nbytes)
        self.checksums.append(time.perf_counter() - began)
        self.idle[number].set()

    def restore_time(self, state: dict[str, Any]) -> dict[str, float]:
        for e in self.idle:
            e.wait(60)
        restore = self.directory / "restore"
        restore.mkdir()
        path = restore / "rank0.0"
        p = slotfile.plan(state)
        path.write_bytes(b"")
        os.truncate(path, p.total)
        w = slotfile.Writer(slotfile.map_for_writing(str(path), p.total))
        copying = w.write(p, 1)
        if copying is not None:
            copying.wait()
            w.seal(p.total, 1)
        digest = slotfile.checksum(w.mapping, p.total)
        w.close()
        shutil.copyfile(path, restore / "rank0.1")  # the rank's other slot, which a standby maps too
        mapped, premapped, mapped_cpu, premapped_cpu = [], [], [], []
        for _ in range(RESTORE_REPEATS):
            began, cpu = time.perf_counter(), time.process_time()  # CPU: the page faults, the checksum
            _, back, _ = slotfile.read_slot(str(path), p.total, digest, 1)
            mapped.append(time.perf_counter() - began)
            mapped_cpu.append(time.process_time() - cpu)
            assert torch.equal(back["model"]["layer0.weight"], state["model"]["layer0.weight"].cpu())
            del back
            premap(restore)  # what a standby does while it waits for its go
            began, cpu = time.perf_counter(), time.process_time()
            _, back, _, served = snapshots.read_held(str(path), p.total, digest, 1)
            premapped.append(time.perf_counter() - began)
            premapped_cpu.append(time.process_time() - cpu)
            assert served == "premapped" and torch.equal(back["model"]["layer0.weight"],
                                                         state["model"]["layer0.weight"].cpu())  # fmt: skip
            del back
        return {"seconds": statistics.median(mapped), "premapped_seconds": statistics.median(premapped),
                "cpu_seconds": statistics.median(mapped_cpu),
                "premapped_cpu_seconds": statistics.median(premapped_cpu), "bytes": p.total}  # fmt: skip

    def close(self) -> None:
        for w in self.writers:
            if w is not None:
                w.close()


def premap(directory: Path) -> None:
    """A standby's premap of rank 0's slots in ``directory``, its go already waiting."""
    os.environ[ENV_PREMAP], os.environ["RANK"] = str(directory), "0"
    module = bootstrap._sibling("bootstrap_premap.py")
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(b"go\n")
        module.wait(theirs.fileno())


def calibrate(step_s: float, device: str = "cpu") -> tuple[torch.Tensor, int]:
    """Matrix products for a step of ``step_s``: the fastest of 5 trials (a busy machine's
    slow trial would make every step short)."""
    a = torch.randn(*((512, 512) if device == "cpu" else (8192, 8192)), device=device)
    trials = []
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(10):
            a @ a
        sync(a)
        trials.append((time.perf_counter() - began) / 10)
    return a, max(1, round(step_s / min(trials)))


def sync(a: torch.Tensor) -> None:
    """A step ends when its device is done (as a real one's ``loss.item()``)."""
    if a.is_cuda:
        torch.cuda.synchronize(a.device)


def step(a: torch.Tensor, reps: int, state: dict[str, Any]) -> None:
    for _ in range(reps):
        a @ a
    state["model"]["layer0.weight"].add_(1e-3)
    state["loader"]["position"] += 1
    sync(a)


def slot_ram() -> dict[str, int] | None:
    """The bytes this rank's slot files hold in RAM (allocated tmpfs pages) and their sizes,
    as the daemon made them; None when no snapshot went through a daemon."""
    from supervisor.client import snapshots  # noqa: PLC0415

    held = snapshots._Current.snapshots  # the bench reads the client's slot paths
    paths = [slot.path for slot in held.slots if slot.path] if held is not None else []
    if not paths:
        return None
    stats = [os.stat(path) for path in paths]
    return {"files": len(stats), "ram": sum(st.st_blocks * 512 for st in stats),
            "size": sum(st.st_size for st in stats)}  # fmt: skip


def measure(size: int, rounds: int, steps: int, step_s: float, snap: Any, *, device: str) -> dict[str, Any]:
    state = make_state(size, device)
    a, reps = calibrate(step_s, device)
    plain: list[float] = []
    with_snap: list[float] = []
    costs: list[float] = []
    taken = 0
    n = 0
    for r in range(rounds * 2):
        snapshotting = r % 2 == 1  # interleaved: without, with, without, ...
        for _ in range(steps):
            began = time.perf_counter()
            step(a, reps, state)
            n += 1
            if snapshotting:
                t = time.perf_counter()
                taken += bool(snap(state, n))
                costs.append(time.perf_counter() - t)
            (with_snap if snapshotting else plain).append(time.perf_counter() - began)
    first, steady = costs[:2], sorted(costs[2:])  # the first into each slot faults its pages in
    return {
        "bytes": state_bytes(state),
        "steps": len(costs),
        "taken": taken,
        "reps": reps,
        "snapshot_first": max(first),
        "snapshot_median": statistics.median(steady),
        "snapshot_p99": steady[min(len(steady) - 1, round(0.99 * (len(steady) - 1)))],
        "step_without": statistics.median(plain),
        "step_with": statistics.median(with_snap),
        "slots": slot_ram(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,1024", help="state sizes in MB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--step-ms", type=float, default=200.0)
    ap.add_argument("--restore-mb", type=int, default=1024)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-snapshots", action="store_true", help="the same steps, no snapshot")
    ap.add_argument("--device", default="cpu", help="where the state and the steps are: cpu or cuda")
    args = ap.parse_args()
    daemon = client.is_active()
    directory = Path(tempfile.mkdtemp(prefix="ft-snapshot-bench-", dir="/dev/shm"))
    layer = SlotLayer(directory)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    results: dict[str, Any] = {"through": "daemon" if daemon else "slot layer", "sizes": [], "device": device}
    try:
        snap = client.snapshot if daemon else layer.snapshot
        if args.no_snapshots:
            snap, args.restore_mb = (lambda state, step: False), 0
            results["through"] = "no snapshots"
        for mb in (int(s) for s in args.sizes.split(",")):
            results["sizes"].append(measure(mb * MB, args.rounds, args.steps, args.step_ms / 1000, snap,
                                            device=args.device))  # fmt: skip
        if args.restore_mb:
            state = make_state(args.restore_mb * MB, args.device)
            if daemon:
                client.snapshot(state, RESTORE_STEP)  # newer than every step measured
                began = time.perf_counter()
                held = client.restore()
                seconds = time.perf_counter() - began
                same = held is not None and all(  # what the device held, bit for bit
                    torch.equal(held[1]["model"][k], v.cpu()) for k, v in state["model"].items())  # fmt: skip
                results["restore"] = {"seconds": seconds, "bytes": state_bytes(state), "same": same,
                                      "step": None if held is None else held[0]}  # fmt: skip
            else:
                results["restore"] = layer.restore_time(state)
        results["checksum_median"] = statistics.median(layer.checksums) if layer.checksums else None
    finally:
        layer.close()
        shutil.rmtree(directory, ignore_errors=True)
    text = json.dumps(results, indent=1)
    if args.json:
        args.json.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
