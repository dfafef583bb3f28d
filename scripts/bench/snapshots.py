"""In-memory snapshots (issue 25): what ``client.snapshot`` costs the training thread
every step, and what ``client.restore`` of 1 GB takes.

How to run (from the repository root, in the project's virtualenv)::

    .venv/bin/python scripts/bench/snapshots.py                       # through a daemon
    .venv/bin/python scripts/bench/snapshots.py --layer slots         # the slot layer alone
    .venv/bin/python scripts/bench/snapshots.py --sizes 100 --rounds 3  # shorter

Method: one rank (``_snapshot_rank.py``) holds a model's and an optimizer's state of
``--sizes`` MB (float32 tensors) and runs ``--step-ms`` steps (matrix products,
calibrated at start; the state's first tensor and the loader's position updated each
step). Rounds of ``--steps`` steps alternate without and with ``client.snapshot(state,
step)`` after each step, ``--rounds`` of each. Figures: the call's time on the training
thread (median and p99 from the third on; the first into each slot also faults the
slot's pages in: its own column), the median step with and without (the call included),
the difference and the slowdown; then ``client.restore()`` of
``--restore-mb`` MB (the round trip, the checksum verified, the state mapped).

``--layer daemon`` (the default) runs the rank under ``ft-supervisor run`` (the daemon
owns the slot files: ``snapshot_begin`` round trip included); ``--layer slots`` runs it by
hand, on slot files of its own in /dev/shm: the same flattening, copy and background
checksum, without the daemon's round trip and records. The table says which.

Memory (``--layer daemon``): after each size the host RAM of the rank's two slot files
(their allocated tmpfs pages, which the rank's mapping shares: counted once), and the
daemon's own peak RSS (VmHWM of the ``ft-supervisor run`` process) against a second run of
the same steps without a snapshot (``--no-snapshots`` to the rank; ``--no-baseline`` skips
it). One node alone holds no replica: ``snapshot_replication.py`` measures what a node of a
job holds (retained copies, its peer's replicas, the staging file).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Launcher, become_subreaper, fmt

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# the virtualenv's own, else the one on PATH (a GPU machine's, installed beside its torch)
FT = shutil.which("ft-supervisor", path=str(Path(sys.executable).parent)) or "ft-supervisor"


def run_rank(args: argparse.Namespace, out: Path, *, snapshots: bool = True) -> dict[str, Any] | None:
    out.mkdir(parents=True, exist_ok=True)
    result = out / "result.json"
    rank_args = ["--sizes", args.sizes, "--rounds", str(args.rounds), "--steps", str(args.steps),
                 "--step-ms", str(args.step_ms), "--restore-mb", str(args.restore_mb),
                 "--device", args.device, "--json", str(result),
                 *([] if snapshots else ["--no-snapshots"])]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if args.layer == "slots":
        env = {k: v for k, v in env.items() if not k.startswith("FT_SUPERVISOR_")}
        done = subprocess.run([sys.executable, str(HERE / "_snapshot_rank.py"), *rank_args], env=env,
                              timeout=args.timeout, check=False)  # fmt: skip
        ok = done.returncode == 0
    else:
        argv = [FT, "run", "--nproc-per-node", "1", "--preload", "none", "--max-restarts", "0",
                "--log-dir", str(out / "logs"), "--rdzv-id", "snapshots",
                "--snapshot-memory", args.snapshot_memory,
                str(HERE / "_snapshot_rank.py"), *rank_args]  # fmt: skip
        launcher = Launcher(argv, out, env=env)
        launcher.start()
        launcher.finish(time.monotonic() + args.timeout)
        ok = launcher.run.exit_code == 0
        if not ok:
            print(f"the run in {out} failed: exit {launcher.run.exit_code}", file=sys.stderr)
        elif result.exists():
            measured = json.loads(result.read_text())
            measured["daemon_hwm_kb"] = launcher.run.peak_hwm_kb
            result.write_text(json.dumps(measured, indent=1))
    return json.loads(result.read_text()) if ok and result.exists() else None


def memory_table(r: dict[str, Any], without: dict[str, Any] | None) -> str:
    mib = 2**20
    rows = ["| state | slot files per rank (two slots): RAM | their size | daemon peak RSS, "
            "with snapshots | without |", "|---|---|---|---|---|"]  # fmt: skip
    base = f"{without['daemon_hwm_kb'] / 1024:.1f} MiB" if without and without.get("daemon_hwm_kb") else "-"
    for s in r["sizes"]:
        slots = s.get("slots") or {}
        ram = f"{slots['ram'] / mib:.0f} MiB" if slots else "-"
        size = f"{slots['size'] / mib:.0f} MiB" if slots else "-"
        rows.append(f"| {s['bytes'] / mib:.0f} MB | {ram} | {size} "
                    f"| {r['daemon_hwm_kb'] / 1024:.1f} MiB | {base} |")  # fmt: skip
    return "\n".join(rows)


def table(r: dict[str, Any], step_ms: float) -> str:
    rows = [f"Through: {r['through']}; on {r.get('device', 'cpu')}; a {step_ms:g} ms step; times in ms.", "",
            "| state | snapshots | snapshot() median | p99 | first into a slot | step without | step with"
            " | added per step | slowdown |",
            "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for s in r["sizes"]:
        added = s["step_with"] - s["step_without"]
        keys = ("snapshot_median", "snapshot_p99", "snapshot_first", "step_without", "step_with")
        ms = [fmt(s[k] * 1000, 1) for k in keys] + [fmt(added * 1000, 1)]
        rows.append(f"| {s['bytes'] / 2**20:.0f} MB | {s['taken']}/{s['steps']} | {' | '.join(ms)}"
                    f" | {added / s['step_without'] * 100:+.1f} % |")  # fmt: skip
    if r.get("checksum_median") is not None:
        checksum = r["checksum_median"] * 1000
        rows.append(f"\nBackground checksum (xxh3_64) of the last state, median: {checksum:.1f} ms")
    restore = r.get("restore")
    if restore:
        ms = restore["seconds"] * 1000
        cpu = f" ({restore['cpu_seconds'] * 1000:.1f} CPU-ms)" if "cpu_seconds" in restore else ""
        verdict = {True: ", the state bit for bit", False: ", NOT the state snapshotted"}
        same = verdict.get(restore.get("same"), "")
        rows.append(f"restore() of {restore['bytes'] / 2**20:.0f} MB: {ms:.1f} ms{cpu}{same}")
        if restore.get("premapped_seconds") is not None:
            ms, cpu_ms = restore["premapped_seconds"] * 1000, restore["premapped_cpu_seconds"] * 1000
            rows.append(f"... from a warm standby's premapped slot: {ms:.1f} ms ({cpu_ms:.1f} CPU-ms); "
                        "medians of 9, interleaved with the one above")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layer", choices=("daemon", "slots"), default="daemon")
    ap.add_argument("--sizes", default="100,1024", help="state sizes, MB, comma-separated")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of each (without, with)")
    ap.add_argument("--steps", type=int, default=10, help="steps per round")
    ap.add_argument("--step-ms", type=float, default=200.0)
    ap.add_argument("--restore-mb", type=int, default=1024)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: the state and the steps on the GPU")
    ap.add_argument("--snapshot-memory", default="0.5", help="the daemon's budget (--layer daemon)")
    ap.add_argument("--timeout", type=float, default=1200.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--no-baseline", action="store_true", help="skip the run without snapshots")
    args = ap.parse_args()
    become_subreaper()
    out = args.out or Path(tempfile.mkdtemp(prefix="ft-bench-snapshots-"))
    out.mkdir(parents=True, exist_ok=True)
    result = run_rank(args, out / "snapshots")
    if result is None:
        sys.exit(1)
    print(table(result, args.step_ms))
    if args.layer == "daemon":
        without = None if args.no_baseline else run_rank(args, out / "without", snapshots=False)
        print()
        print(memory_table(result, without))


if __name__ == "__main__":
    main()
