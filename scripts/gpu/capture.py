"""Capture real CUDA and NCCL failure texts under ft-supervisor, on a machine with a GPU.

    python scripts/gpu/capture.py OUT [--faults oom,illegal,...] [--timeout 90]

Each fault of faults.py runs as its own job: ``ft-supervisor run --max-restarts 0
--no-standby`` with the ranks' logs, events and any hang bundle under
``OUT/<fault>/``, then ``ft-supervisor classify`` of that run. ``OUT/summary.json``
says, per fault, the daemon's exit code, its classification and decision, and how
long the job took; ``OUT/versions.json`` the device, driver, CUDA, torch and NCCL
versions the texts came from; ``OUT/dmesg.txt`` the kernel log lines the faults
added, when the kernel log is readable. Standard library and torch only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FAULTS = HERE / "faults.py"
# fault: (ranks, environment added, options added)
JOBS: dict[str, tuple[int, dict[str, str], list[str]]] = {
    "oom": (1, {}, []),
    "illegal": (1, {}, []),
    "assert": (1, {}, []),
    "timeout": (1, {}, []),
    "duplicate": (2, {}, []),
    "ordinal": (2, {}, []),
    "hidden": (1, {"CUDA_VISIBLE_DEVICES": "7"}, []),
    "hang": (1, {}, ["--ft-rank-heartbeat-timeout", "4"]),
}


def versions() -> dict[str, Any]:
    code = (
        "import json, torch, platform; p = torch.cuda.get_device_properties(0);"
        "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda,"
        "'nccl': '.'.join(map(str, torch.cuda.nccl.version())), 'gpu': p.name,"
        "'gpu_memory_gib': round(p.total_memory / 2**30, 1), 'python': platform.python_version(),"
        "'kernel': platform.release()}))"
    )
    found: dict[str, Any] = {}
    try:
        found.update(json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                               timeout=60, check=True).stdout))  # fmt: skip
    except (subprocess.SubprocessError, json.JSONDecodeError, OSError) as exc:
        found["torch_error"] = str(exc)
    try:
        query = ["nvidia-smi", "--query-gpu=driver_version,name,vbios_version", "--format=csv,noheader"]
        smi = subprocess.run(query, check=False, capture_output=True, text=True, timeout=30)
        found["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (subprocess.SubprocessError, OSError) as exc:
        found["nvidia_smi"] = f"unavailable: {exc}"
    return found


def dmesg() -> list[str] | str:
    try:
        done = subprocess.run(["dmesg"], check=False, capture_output=True, text=True, timeout=30)
    except (subprocess.SubprocessError, OSError) as exc:
        return f"unreadable: {exc}"
    return done.stdout.splitlines() if done.returncode == 0 else f"unreadable: {done.stderr.strip()}"


def events(log_dir: Path) -> list[dict[str, Any]]:
    found = sorted(log_dir.glob("*/*/events.jsonl"))
    if not found:
        return []
    out = []
    for line in found[-1].read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def capture(fault: str, out: Path, daemon: list[str], timeout: float) -> dict[str, Any]:
    nproc, env, options = JOBS[fault]
    where = out / fault
    where.mkdir(parents=True)
    argv = [*daemon, "run", "--nproc-per-node", str(nproc), "--max-restarts", "0", "--no-standby",
            "--log-dir", str(where / "logs"), "--run-id", fault, *options,
            str(FAULTS), "--fault", fault]  # fmt: skip
    began = time.monotonic()
    with (where / "daemon.out").open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                start_new_session=True)  # fmt: skip
        try:
            code: int | None = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            code = None
    seconds = round(time.monotonic() - began, 2)
    found = events(where / "logs")
    run_dirs = sorted((where / "logs").glob("*/*/events.jsonl"))
    classified = ""
    if run_dirs:
        classify = [*daemon, "classify", str(run_dirs[-1].parent)]
        done = subprocess.run(classify, check=False, capture_output=True, text=True, timeout=60)
        classified = done.stdout + done.stderr
        (where / "classify.txt").write_text(classified)
    pick = {"decision", "rank_failure_reported", "rank_exit_stuck", "rank_hung", "hang_bundle"}
    return {
        "fault": fault,
        "exit_code": code,
        "seconds": seconds,
        "events": [e for e in found if e.get("event") in pick],
        "classify": classified[-2000:],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--faults", default=",".join(JOBS))
    p.add_argument("--timeout", type=float, default=90.0, help="seconds a fault's job may take")
    p.add_argument("--daemon", default=f"{sys.executable} -m supervisor", help="how to run ft-supervisor")
    a = p.parse_args()
    faults = [f for f in a.faults.split(",") if f]
    unknown = sorted(set(faults) - set(JOBS))
    if unknown:
        p.error(f"--faults: unknown {unknown}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "versions.json").write_text(json.dumps(versions(), indent=1))
    before = dmesg()
    summary = []
    for fault in faults:
        result = capture(fault, a.out, a.daemon.split(), a.timeout)
        summary.append(result)
        decided = [(e.get("rule"), e.get("action")) for e in result["events"] if e.get("event") == "decision"]
        print(f"{fault}: exit {result['exit_code']} in {result['seconds']} s, decision {decided}", flush=True)
        (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    after = dmesg()
    if isinstance(before, list) and isinstance(after, list):
        (a.out / "dmesg.txt").write_text("\n".join(after[len(before) :]) + "\n")
    else:
        (a.out / "dmesg.txt").write_text(f"{after}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
