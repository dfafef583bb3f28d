"""Snapshots replicated to a peer node (issue 25): what the replication costs the ranks'
steps. Two daemons on loopback as one job (a c10d store hosted here), one rank each
(``_snapshot_rank.py``: ``--sizes`` MB of state, ``--step-ms`` steps, rounds without and
with ``client.snapshot`` every step), once with ``--snapshot-replication-rate 0`` and once
with ``--rate``, ``--pairs`` times, each first in turn. Figures: the median step with snapshots,
without and with replication, per node, and the peer's replication lag at the end.

Memory: every 0.2 s while a job runs, each daemon's run directory in /dev/shm
(``ft-supervisor-<daemon pid>-*``) is read file by file (allocated tmpfs pages, as the
kernel counts them), by kind: the rank's two slots (``rank<R>.<slot>``), the copies the peer
verified (``retained.*``), the peer's replicas (``replica.*``) and the staging file
(``stage``); the table gives each node's peak of each kind and of the whole, and the
daemon's own peak RSS (VmHWM of the ``ft-supervisor run`` process).

How to run (from the repository root, in the project's virtualenv)::

    .venv/bin/python scripts/bench/snapshot_replication.py                  # 100 MB, 256M/s
    .venv/bin/python scripts/bench/snapshot_replication.py --sizes 10 --pairs 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from supervisor.process.ports import free_port  # noqa: E402 - after the path

KINDS = ("slots", "retained", "replicas", "staging")


def kind_of(name: str) -> str:
    if name.startswith("retained."):
        return "retained"
    if name.startswith("replica."):
        return "replicas"
    return "slots" if name.startswith("rank") else "staging"


class Sampler(threading.Thread):
    """The peak tmpfs bytes of each daemon's run directory, by kind of file and in all."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids, self.stop = pids, threading.Event()
        self.peak: dict[int, dict[str, int]] = {p: dict.fromkeys((*KINDS, "all", "hwm"), 0) for p in pids}

    def run(self) -> None:
        while not self.stop.wait(0.2):
            for pid in self.pids:
                now = dict.fromkeys((*KINDS, "all"), 0)
                for d in Path("/dev/shm").glob(f"ft-supervisor-{pid}-*"):
                    try:
                        files = list(d.iterdir())
                    except OSError:  # the run ended: its directory is gone
                        continue
                    for f in files:
                        try:
                            used = f.stat().st_blocks * 512
                        except OSError:  # renamed or removed between the listing and the stat
                            continue
                        now[kind_of(f.name)] += used
                        now["all"] += used
                now["hwm"] = hwm(pid)
                peak = self.peak[pid]
                for k, v in now.items():
                    peak[k] = max(peak[k], v)


def hwm(pid: int) -> int:
    """The process's peak RSS in bytes (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def run_job(args: argparse.Namespace, out: Path, rate: str) -> list[dict[str, Any]]:
    from torch.distributed import TCPStore  # noqa: PLC0415 - the store, as a stable endpoint is

    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True, wait_for_workers=False)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs, results = [], []
    for n in range(2):
        result = out / f"rate{rate}.node{n}.json"
        results.append(result)
        argv = [sys.executable, "-m", "supervisor", "run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"r{rate}",
                "--rdzv-conf", "is_host=0,last_call_timeout=1", "--local-addr", "127.0.0.1",
                "--preload", "none", "--max-restarts", "0", "--log-dir", str(out / f"logs{rate}.{n}"),
                "--snapshot-memory", args.snapshot_memory, "--snapshot-replication-rate", rate,
                str(HERE / "_snapshot_rank.py"), "--sizes", args.sizes, "--rounds", str(args.rounds),
                "--steps", str(args.steps), "--step-ms", str(args.step_ms), "--restore-mb", "1",
                "--json", str(result)]  # fmt: skip
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    sampler = Sampler([p.pid for p in procs])
    sampler.start()
    try:
        codes = [p.wait(args.timeout) for p in procs]
    finally:
        sampler.stop.set()
        sampler.join()
        MEMORY.setdefault(rate, []).extend(sampler.peak.values())
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        del store
    if codes != [0, 0]:
        sys.exit(f"the job with rate {rate} failed: {codes} (logs in {out})")
    return [json.loads(r.read_text()) for r in results]


MEMORY: dict[str, list[dict[str, int]]] = {}  # rate -> each node's peaks, each job


def replicated(out: Path, rate: str) -> list[dict[str, Any]]:
    events = []
    for f in out.glob(f"logs{rate}.*/**/events.jsonl"):
        lines = f.read_text().splitlines()
        events += [e for e in map(json.loads, lines) if e["event"] == "snapshot_replicated"]
    return events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100", help="state per rank, MB (one size)")
    ap.add_argument("--rate", default="256M")
    ap.add_argument("--pairs", type=int, default=2, help="jobs without and with replication, alternately")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--step-ms", type=float, default=200.0)
    ap.add_argument("--snapshot-memory", default="2G")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="ft-bench-replication-"))
    steps: dict[str, list[float]] = {"0": [], args.rate: []}
    snaps: dict[str, list[float]] = {"0": [], args.rate: []}
    started = time.monotonic()
    for pair in range(args.pairs):
        for rate in ("0", args.rate) if pair % 2 == 0 else (args.rate, "0"):  # either first in turn
            for r in run_job(args, out, rate):
                (size,) = r["sizes"]
                steps[rate].append(size["step_with"])
                snaps[rate].append(size["snapshot_median"])
    print(f"{args.sizes} MB a rank, a {args.step_ms:g} ms step, 2 nodes x 1 rank on loopback, "
          f"{args.pairs} job(s) each, {time.monotonic() - started:.0f} s in all; per node, the median "
          "step with a snapshot every step, ms\n")  # fmt: skip
    print("| replication | step with snapshot (each node, each job) | median | snapshot() median |")
    print("|---|---|---|---|")
    for rate in ("0", args.rate):
        each = ", ".join(f"{s * 1000:.1f}" for s in steps[rate])
        print(f"| {rate} B/s | {each} | {statistics.median(steps[rate]) * 1000:.1f} "
              f"| {statistics.median(snaps[rate]) * 1000:.1f} |")  # fmt: skip
    lags = [e["seconds"] for e in replicated(out, args.rate)]
    if lags:
        print(f"\nsnapshot_replicated (sampled): {len(lags)}, from taken to kept by the peer: "
              f"median {statistics.median(lags) * 1000:.0f} ms")  # fmt: skip
    state = float(args.sizes) * 2**20
    print("\nper node (one rank), the peak of /dev/shm held by the daemon, MiB (x the rank's state), "
          "the largest over the jobs:\n")  # fmt: skip
    print("| replication | " + " | ".join(KINDS) + " | all | daemon peak RSS |")
    print("|---|" + "---|" * (len(KINDS) + 2))
    for rate in ("0", args.rate):
        peaks = MEMORY.get(rate, [])
        cells = [max((p[k] for p in peaks), default=0) for k in (*KINDS, "all")]
        rss = max((p["hwm"] for p in peaks), default=0)
        print(f"| {rate} B/s | " + " | ".join(f"{c / 2**20:.0f} ({c / state:.1f}x)" for c in cells)
              + f" | {rss / 2**20:.1f} MiB |")  # fmt: skip


if __name__ == "__main__":
    main()
