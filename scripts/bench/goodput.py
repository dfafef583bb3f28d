"""Goodput benchmark: one training job through a fixed schedule of faults, under
ft-supervisor (with disk snapshots alone, and with memory snapshots every step), torchrun
(as shipped, and with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) and NVIDIA's ft_launcher, side
by side.

How to run (from the repository root, in the project's virtualenv)::

    .venv/bin/python scripts/bench/goodput.py                  # 3 runs of each, ~30 min
    .venv/bin/python scripts/bench/goodput.py --runs 5 --out /tmp/goodput
    .venv/bin/python scripts/bench/goodput.py --launchers ft,ft_launcher --quick
    .venv/bin/python scripts/bench/goodput.py --launchers ft,ft-snap --step-time 0.1  # issue 25

The first run creates ``.bench/nvrx-venv`` (nvidia-resiliency-ext from PyPI, torch
pinned to the CPU build through constraints.txt) for ft_launcher and its ranks:
NVIDIA's launcher and client run from their own install, not ours.

Method
------
The job is ``scripts/bench/_goodput_rank.py``: 2 ranks, DDP over gloo on CPU,
``--steps`` steps of ``--step-time`` s (400 x 50 ms: 20 s of work), a snapshot every
``--save-every`` steps (20) that every generation resumes from. The schedule
(``--faults``, default ``5:raise,100:hang,200:nccl,300:sigkill``) fires, on rank 1,
a Python exception at step 5 (0.25 s in: before any standby can be ready), a hang
(the rank sleeps; its peer waits in the all-reduce), an exception carrying NCCL's
watchdog-timeout message, and a SIGKILL, each exactly once (a marker file per
fault), whatever the launcher calls its generations.

``ft-snap`` is ft-supervisor with the state also held in the daemon's memory:
``client.snapshot(state, step)`` after every step, ``client.resume(disk_step)`` at start
(the newer of that and the disk snapshot), disk snapshots every ``--snap-save-every``
steps (100) instead of ``--save-every``. Each rank says where it resumed from (step and
source), so the table gives the steps each fault made the job redo: the step the fault
fired at (steps done) less the step the next generation resumed from.

Every launcher gets the same limits: ``--max-restarts`` = faults + 1; heartbeats
every step with a 5 s heartbeat timeout (``--hb-timeout``) and 60 s before the
first, where the launcher has them (ft-supervisor through its client, ft_launcher
through NVIDIA's ``RankMonitorClient``); the process group's collective timeout
``--pg-timeout`` (30 s) for all, which is torchrun's only way out of a hang.
Each launcher also runs the job without faults: its ceiling.

Figures, per launcher (medians over ``--runs`` runs, interleaved launcher by
launcher so that a busy moment of the machine hurts all alike):

* wall: the launcher started -> it exited (every rank done);
* goodput: the work (steps x step time) / wall. "of fault-free": against this
  launcher's own fault-free run; the ratio columns compare with ft_launcher's and
  torchrun's goodput (the noshare one where the default one did not finish);
* downtime per fault: the fault -> the last rank's first step afterwards (detection,
  teardown, the restart, the rendezvous, loading the snapshot, one step); the work
  redone since the last snapshot is not in it but is in the goodput;
* restarts: generations after the first; launcher peak RSS (VmHWM, the launcher
  process alone); whole tree peak PSS (launcher, helpers and ranks, standbys
  included, sampled every ~0.5 s).

A run that did not finish (timed out, or the launcher gave up) says why below the
table; its goodput is 0 for the medians.

Linux only. Standard library only (the ranks use torch).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from _common import (
    Interrupted,
    Launcher,
    become_subreaper,
    descendants,
    error_message,
    install_stop_handlers,
    process_table,
    read_jsonl,
)
from _goodput_report import LABELS, report

REPO = Path(__file__).resolve().parents[2]
RANK_SCRIPT = REPO / "scripts" / "bench" / "_goodput_rank.py"
NVRX_VENV = REPO / ".bench" / "nvrx-venv"
NPROC = 2
LAUNCHERS = ("ft", "ft-snap", "torchrun", "torchrun-noshare", "ft_launcher")
NOSHARE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
TREE_EVERY = 0.5  # seconds between whole-tree PSS samples


@dataclass(frozen=True, slots=True)
class Settings:
    runs: int
    launchers: tuple[str, ...]
    steps: int
    step_time: float
    save_every: int
    snap_save_every: int  # ft-snap's disk interval: memory snapshots every step between
    faults: str
    hb_timeout: float
    pg_timeout: float
    timeout: float
    out: Path
    python: Path  # ours: ft-supervisor and torchrun
    nvrx_python: Path | None
    clean: bool = True  # also the fault-free runs (each launcher's ceiling)

    @property
    def fault_count(self) -> int:
        return len([f for f in self.faults.split(",") if f.strip()])

    @property
    def nproc(self) -> int:
        return NPROC

    @property
    def work_s(self) -> float:
        return self.steps * self.step_time


@dataclass(slots=True)
class RunResult:
    launcher: str
    faulted: bool
    index: int
    run_dir: str
    ok: bool = False
    exit_code: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    goodput: float = 0.0
    downtimes: list[float | None] = field(default_factory=list)
    resumed: list[tuple[int, str] | None] = field(default_factory=list)  # per fault: step, source
    redone: list[int | None] = field(default_factory=list)  # per fault: its step less the resumed one
    mixed: list[str] = field(default_factory=list)  # ranks of one generation that resumed apart
    restarts: int = 0
    launcher_hwm_kb: int = 0
    tree_pss_kb: int = 0
    failure: str | None = None
    leftovers: list[str] = field(default_factory=list)


# -- the launchers -------------------------------------------------------------------------


def ensure_nvrx_venv(python: str = sys.executable) -> Path:
    """NVIDIA's launcher in a venv of its own, torch pinned to the CPU build."""
    py = NVRX_VENV / "bin" / "python"
    if (NVRX_VENV / "bin" / "ft_launcher").exists():
        return py
    print(f"creating {NVRX_VENV} (nvidia-resiliency-ext, torch pinned by constraints.txt)", file=sys.stderr)
    subprocess.run([python, "-m", "venv", str(NVRX_VENV)], check=True, timeout=300)
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "-c", str(REPO / "constraints.txt"),
         "torch", "numpy", "nvidia-resiliency-ext"],
        check=True, timeout=1800,
    )  # fmt: skip
    return py


def rank_args(s: Settings, run_dir: Path, faulted: bool, client: str, memory: bool = False) -> list[str]:
    (run_dir / "faults").mkdir()
    save_every = s.snap_save_every if memory else s.save_every
    return [
        str(RANK_SCRIPT), *(["--memory-snapshots"] if memory else []),
        "--steps", str(s.steps), "--step-time", str(s.step_time), "--save-every", str(save_every),
        "--snapshot", str(run_dir / "snapshot.pt"), "--fault-dir", str(run_dir / "faults"),
        "--faults", s.faults if faulted else "", "--client", client,
        "--pg-timeout", str(s.pg_timeout), "--events", str(run_dir / "events.jsonl"),
    ]  # fmt: skip


def launcher_argv(name: str, s: Settings, run_dir: Path, faulted: bool) -> list[str]:
    common = [
        "--nproc-per-node", str(NPROC),
        "--max-restarts", str(s.fault_count + 1),
        "--rdzv-id", f"goodput-{name}-{uuid.uuid4().hex[:8]}",
    ]  # fmt: skip
    hb = [
        "--ft-rank-heartbeat-timeout", str(s.hb_timeout),
        "--ft-initial-rank-heartbeat-timeout", "60",
    ]  # fmt: skip
    bin_dir = s.python.parent
    if name in ("ft", "ft-snap"):
        return [str(bin_dir / "ft-supervisor"), "run", *common, "--log-dir", str(run_dir / "logs"), *hb,
                *rank_args(s, run_dir, faulted, "ft", memory=name == "ft-snap")]  # fmt: skip
    if name in ("torchrun", "torchrun-noshare"):
        return [str(bin_dir / "torchrun"), *common, *rank_args(s, run_dir, faulted, "none")]
    assert s.nvrx_python is not None
    return [str(s.nvrx_python.parent / "ft_launcher"), *common, *hb,
            *rank_args(s, run_dir, faulted, "nvrx")]  # fmt: skip


# -- one run -------------------------------------------------------------------------------


def tree_pss_kb(root: int) -> int:
    table = process_table()
    total = 0
    for pid in (root, *descendants(root, table)):
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total += next((int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("Pss:")), 0)
    return total


def run_once(name: str, faulted: bool, index: int, s: Settings) -> RunResult:
    run_dir = s.out / f"{name}-{'faults' if faulted else 'clean'}-{index}"
    run_dir.mkdir(parents=True)
    r = RunResult(name, faulted, index, str(run_dir))
    env = {k: v for k, v in os.environ.items() if k not in NOSHARE_ENV}
    env |= {"OMP_NUM_THREADS": "1", **(NOSHARE_ENV if name == "torchrun-noshare" else {})}
    launcher = Launcher(launcher_argv(name, s, run_dir, faulted), run_dir, env=env)
    launcher.start()
    deadline = time.monotonic() + s.timeout
    try:
        while not launcher.poll(TREE_EVERY, deadline) and time.monotonic() < deadline:
            r.tree_pss_kb = max(r.tree_pss_kb, tree_pss_kb(launcher.pid))
    except BaseException:
        launcher.abort()  # interrupted: stop it and everything it started, now
        raise
    launcher.finish(deadline)
    run = launcher.run
    r.exit_code, r.timed_out, r.wall_s = run.exit_code, run.timed_out, run.wall_s
    r.launcher_hwm_kb, r.leftovers = run.peak_hwm_kb, run.leftovers
    analyse(r, run_dir, s)
    return r


def analyse(r: RunResult, run_dir: Path, s: Settings) -> None:
    events = read_jsonl(run_dir / "events.jsonl")
    done = {e["rank"] for e in events if e["event"] == "done" and e.get("steps") == s.steps}
    r.ok = len(done) == NPROC and r.exit_code == 0 and not r.timed_out
    r.goodput = s.work_s / r.wall_s if r.ok and r.wall_s > 0 else 0.0
    firsts = [e for e in events if e["event"] == "first_step"]
    resumes = [e for e in events if e["event"] == "resumed"]
    r.restarts = max(0, len({e["generation"] for e in firsts}) - 1)
    for fault in sorted((e for e in events if e["event"] == "fault"), key=lambda e: e["index"]):
        after = [e for e in firsts if e["t"] > fault["t"]]
        gens = sorted({e["generation"] for e in after})
        stepping = [e["t"] for e in after if gens and e["generation"] == gens[0]]
        r.downtimes.append(max(stepping) - fault["t"] if len(stepping) == NPROC else None)
        # where the next generation resumed: every rank must say the same step
        came = [e for e in resumes if e["t"] > fault["t"] and gens and e["generation"] == gens[0]]
        steps = {(e["step"], e["source"]) for e in came}
        if len(steps) > 1:
            r.mixed.append(f"after fault {fault['index']} the ranks resumed apart: {sorted(steps)}")
        first = min(steps) if steps else None
        r.resumed.append(first)
        r.redone.append(fault["step"] - first[0] if first is not None else None)
    if not r.ok:
        output = (run_dir / "launcher.out").read_text(errors="replace")
        last = [ln for ln in output.splitlines() if ln.strip()][-1:] or ["(no output)"]
        said = f"exit {r.exit_code}, {len(done)}/{NPROC} ranks done: {last[0][:200]}"
        r.failure = f"timed out after {s.timeout:.0f} s" if r.timed_out else error_message(run_dir) or said


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=None, help="runs of each (default 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="1 run, 200 steps, two faults: a smoke test")
    p.add_argument("--launchers", default=",".join(LAUNCHERS), help=f"a subset of {','.join(LAUNCHERS)}")
    p.add_argument("--steps", type=int, default=None, help="steps of the job (default 400)")
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--save-every", type=int, default=20, help="disk snapshots, every N steps")
    p.add_argument("--snap-save-every", type=int, default=100,
                   help="ft-snap's disk snapshots, every N steps (memory snapshots every step)")  # fmt: skip
    p.add_argument("--faults", default=None, help="STEP:raise|hang|nccl|sigkill,... (see the rank script)")
    p.add_argument("--hb-timeout", type=float, default=5.0)
    p.add_argument("--pg-timeout", type=float, default=30.0)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a run is stopped")
    p.add_argument("--out", type=Path, default=None, help="artifact directory (default: a fresh tempdir)")
    p.add_argument("--no-clean", action="store_true", help="only the faulted runs (steps redone per fault)")
    a = p.parse_args(argv)
    launchers = tuple(x.strip() for x in a.launchers.split(",") if x.strip())
    if not launchers or any(x not in LAUNCHERS for x in launchers):
        p.error(f"--launchers {a.launchers!r}: choose from {', '.join(LAUNCHERS)}")
    bin_dir = Path(sys.executable).parent
    for tool, users in (("ft-supervisor", {"ft", "ft-snap"}), ("torchrun", {"torchrun", "torchrun-noshare"})):
        if users & set(launchers) and not (bin_dir / tool).exists():
            p.error(f"{bin_dir / tool} not found: run with the project's .venv/bin/python")
    out = a.out or Path(tempfile.mkdtemp(prefix="ft-bench-goodput-"))
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        p.error(f"--out {out} is not empty: give a fresh directory")
    quick = a.quick
    faults = a.faults or ("5:raise,100:sigkill" if quick else "5:raise,100:hang,200:nccl,300:sigkill")
    nvrx = ensure_nvrx_venv() if "ft_launcher" in launchers else None
    return Settings(
        runs=a.runs or (1 if quick else 3), launchers=launchers, steps=a.steps or (200 if quick else 400),
        step_time=a.step_time, save_every=a.save_every, snap_save_every=a.snap_save_every, faults=faults,
        hb_timeout=a.hb_timeout, pg_timeout=a.pg_timeout, timeout=a.timeout, out=out.resolve(),
        python=Path(sys.executable), nvrx_python=nvrx, clean=not a.no_clean,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    s = parse_args(argv)
    become_subreaper()
    install_stop_handlers()
    results: list[RunResult] = []
    code = 0
    try:
        for index in range(1, s.runs + 1):
            for faulted in (True, False) if s.clean else (True,):
                for name in s.launchers:
                    r = run_once(name, faulted, index, s)
                    results.append(r)
                    print(f"{LABELS[name]:<20} {'faults' if faulted else 'clean':<6} run {index}: "
                          f"{'ok' if r.ok else 'FAILED'} wall {r.wall_s:.1f} s goodput {r.goodput:.3f} "
                          f"downtimes {[None if d is None else round(d, 2) for d in r.downtimes]}",
                          file=sys.stderr, flush=True)  # fmt: skip
    except (KeyboardInterrupt, Interrupted) as exc:
        print(f"interrupted ({exc}): reporting the {len(results)} finished runs", file=sys.stderr)
        code = 130
    (s.out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    if results:
        report(results, s)
    return code


if __name__ == "__main__":
    sys.exit(main())
