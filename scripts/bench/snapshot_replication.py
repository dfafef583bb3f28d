"""Snapshots replicated to a peer node (issue 25): what the replication costs the ranks'
steps. Two daemons on loopback as one job (a c10d store hosted here), one rank each
(``_snapshot_rank.py``: ``--sizes`` MB of state, ``--step-ms`` steps, rounds without and
with ``client.snapshot`` every step), once with ``--snapshot-replication-rate 0`` and once
with ``--rate``, ``--pairs`` times, each first in turn. Figures: the median step with snapshots,
without and with replication, per node, and the peer's replication lag at the end.

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
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from supervisor.process.ports import free_port  # noqa: E402 - after the path


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
    try:
        codes = [p.wait(args.timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        del store
    if codes != [0, 0]:
        sys.exit(f"the job with rate {rate} failed: {codes} (logs in {out})")
    return [json.loads(r.read_text()) for r in results]


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


if __name__ == "__main__":
    main()
