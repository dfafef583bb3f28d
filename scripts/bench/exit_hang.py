"""Does the preload change how a script ends? pytorch/examples' DDP tutorial under
ft-supervisor with a SIGKILL of rank 1 mid-run, per ``--preload`` list.

How to run (from the repository root, in the project's virtualenv)::

    .venv/bin/python scripts/bench/exit_hang.py                      # 3 runs of each variant
    .venv/bin/python scripts/bench/exit_hang.py --runs 20 --variants default

Each run starts ``ft-supervisor run --nproc-per-node 2 --max-restarts 1 --preload <list>``
on ``scripts/bench/ddp_tutorial/multigpu_torchrun.py`` (the tutorial, CPU and gloo) in a
fresh directory, waits until generation 1's standby ranks are ready (they preloaded the
list), SIGKILLs generation 0's rank 1, and lets generation 1 resume from the snapshot
and finish. Variants are interleaved run by run. Per run:

* restart: from the SIGKILL to the moment every rank of generation 1 printed its first
  ``Epoch`` line (the tutorial prints it as the epoch's first step begins; the files are
  polled every 20 ms);
* end: the time from the last rank's last ``Epoch`` line to the launcher's exit, and
  whether a rank hung at exit (the daemon's ``rank_exit_stuck`` event, or the launcher
  still running at ``--timeout``). A run whose training ended before the standbys were
  ready had no SIGKILL: it shows no restart figure.

The table shows medians. Standard library only; every run has a deadline, and the
launcher's process group is killed when it is reached.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _common import ft_event_log, read_jsonl

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = REPO / "scripts" / "bench" / "ddp_tutorial" / "multigpu_torchrun.py"
BASE = "torch,torch.distributed,torch.nn.parallel"
VARIANTS = {
    "dynamo": f"{BASE},torch._dynamo",  # the default before issue 22
    # what torch._dynamo costs to import, without it
    "wide": f"{BASE},torch.fx.experimental.symbolic_shapes,torch.distributed.tensor,torch.distributed.fsdp",
    "default": None,  # whatever the daemon picks (torch, torch.distributed, torch.nn.parallel)
}
POLL = 0.02


@dataclass
class Result:
    variant: str
    restart_s: float | None = None
    end_s: float | None = None
    exit_stuck: bool = False
    timed_out: bool = False
    code: int | None = None


def _gen_lines(log_root: Path, gen: int) -> dict[int, float]:
    """local rank -> when (now) its first Epoch line was seen, for ranks that printed one."""
    out = {}
    for lr in (0, 1):
        for path in log_root.glob(f"*/*/gen_{gen}/local_rank_{lr}/stdout.log"):
            with contextlib.suppress(OSError):
                if "Epoch" in path.read_text(errors="replace"):
                    out[lr] = time.time()
    return out


def one(variant: str, work: Path, epochs: int, timeout: float, exit_grace: float) -> Result:
    res = Result(variant)
    logs = work / "logs"
    preload = VARIANTS[variant]
    argv = [sys.executable, "-m", "supervisor", "run", "--nproc-per-node", "2", "--max-restarts", "1",
            "--log-dir", str(logs), "--run-id", f"exit-{variant}", "--exit-grace", str(exit_grace),
            *(["--preload", preload] if preload else []), str(TUTORIAL), str(epochs), "2"]  # fmt: skip
    out = (work / "launcher.out").open("wb")
    proc = subprocess.Popen(argv, cwd=work, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    killed_at: float | None = None
    seen: dict[int, float] = {}
    last_line = 0.0
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL)
            events = ft_event_log(logs)
            if events is None:
                continue
            if killed_at is None:
                evs = read_jsonl(events)
                ready = any(e.get("event") == "standby_ready" and e.get("generation") == 1 for e in evs)
                pid = next((e["pid"] for e in evs if e.get("event") == "rank_spawned"
                            and e.get("generation") == 0 and e.get("local_rank") == 1), None)  # fmt: skip
                if ready and pid is not None and _gen_lines(logs, 0):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    killed_at = time.time()
            elif len(seen) < 2:
                for lr, at in _gen_lines(logs, 1).items():
                    seen.setdefault(lr, at)
                if len(seen) == 2:
                    res.restart_s = max(seen.values()) - killed_at
            else:
                for path in logs.glob("*/*/gen_1/local_rank_*/stdout.log"):
                    with contextlib.suppress(OSError):
                        last_line = max(last_line, path.stat().st_mtime)
        res.timed_out = proc.poll() is None
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        res.code = proc.wait()
        out.close()
    if last_line:
        res.end_s = time.time() - last_line if res.timed_out else max(0.0, _exited_at(logs) - last_line)
    events = ft_event_log(logs)
    res.exit_stuck = res.timed_out or any(
        e.get("event") == "rank_exit_stuck" for e in read_jsonl(events) if events is not None
    )
    return res


def _exited_at(logs: Path) -> float:
    events = ft_event_log(logs)
    finished = [e for e in read_jsonl(events) if e.get("event") == "run_finished"] if events else []
    return float(finished[-1].get("t_wall", time.time())) if finished else time.time()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--variants", default="dynamo,wide,default", help=f"of {','.join(VARIANTS)}")
    p.add_argument("--epochs", type=int, default=100, help="the tutorial's total_epochs")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per run")
    p.add_argument("--exit-grace", type=float, default=10.0)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    names = [v for v in a.variants.split(",") if v]
    if unknown := [v for v in names if v not in VARIANTS]:
        p.error(f"unknown variant(s) {unknown}")
    out = a.out or Path(tempfile.mkdtemp(prefix="exit-hang-"))
    results: list[Result] = []
    for n in range(a.runs):
        for v in names:
            work = out / f"{v}-{n}"
            work.mkdir(parents=True, exist_ok=True)
            r = one(v, work, a.epochs, a.timeout, a.exit_grace)
            results.append(r)
            print(f"{v:7} run {n}: restart {r.restart_s} s, end {r.end_s} s, exit stuck {r.exit_stuck}, "
                  f"code {r.code}", flush=True)  # fmt: skip
    head = f"{'runs':>4} {'stuck at exit':>13} {'restart s (median)':>18} {'end s (median)':>14}"
    print(f"\n{'preload':48} {head}")
    for v in names:
        rs = [r for r in results if r.variant == v]
        restart = [r.restart_s for r in rs if r.restart_s is not None]
        end = [r.end_s for r in rs if r.end_s is not None and not r.exit_stuck]
        label = VARIANTS[v] or "default"
        print(f"{label:48} {len(rs):>4} {sum(r.exit_stuck for r in rs):>13} "
              f"{statistics.median(restart) if restart else float('nan'):>18.2f} "
              f"{statistics.median(end) if end else float('nan'):>14.2f}")  # fmt: skip
    print(f"\nartifacts: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
