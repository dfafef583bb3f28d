"""Multi-node restart benchmark: ft-supervisor against torchrun, 2 and 4 nodes on loopback.

How to run (from the repository root, in the project's virtualenv)::

    env -u PYTHONUNBUFFERED .venv/bin/python scripts/bench/multinode.py            # 3 runs, ~15 min
    env -u PYTHONUNBUFFERED .venv/bin/python scripts/bench/multinode.py --runs 5 --out /tmp/bench-mn
    env -u PYTHONUNBUFFERED .venv/bin/python scripts/bench/multinode.py --quick    # 1 run, ~5 min
    env -u PYTHONUNBUFFERED .venv/bin/python scripts/bench/multinode.py --nodes 2 --tools ft,torchrun-noshare

(The 4-node torchrun runs take ``--timeout`` each: torchrun as shipped hangs there, see below.)

Method
------
The single-node restart benchmark (restart.py) across nodes: how long from a
rank's crash on one node until every rank on every node steps again. A "node" is
one launcher process on this machine: ``N`` of them (``--nodes``, default 2 and
4) form one job over loopback, exactly as on ``N`` hosts::

    python -m supervisor run            --nnodes N --nproc-per-node 1 \\
    python -m torch.distributed.run     --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT \\
        --rdzv-id ID --local-addr 127.0.0.1 --max-restarts 1 --log-dir DIR \\
        --rdzv-conf keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=60 \\
        scripts/train.py ...

Three variants (``--tools``):

* ``ft``: ``ft-supervisor run`` as shipped (standby ranks pre-started);
* ``torchrun``: torch's launcher as shipped. In torch 2.13 its ranks share the
  rendezvous' TCP store (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` unset), which keeps
  the previous generation's keys: after the restart gloo's ``connectFullMesh`` reads
  the dead ranks' addresses ("Connection refused") and the job fails (2 nodes) or
  hangs (4 nodes): pytorch/pytorch#135712, #167288;
* ``torchrun-noshare``: the same with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, the
  known workaround (global rank 0 hosts a fresh store every generation). The
  ratio column compares with ``torchrun``, or with this one where ``torchrun``
  never recovered (marked).

All get the same flags, the same rendezvous configuration included. One rank
per node: the 4-node job then runs 4 ranks (and ft-supervisor's 4 standby ranks)
on a 2-core machine, where 2 ranks per node would overcommit it and measure the
CPU queue rather than the launchers. ``OMP_NUM_THREADS=1`` for every launcher (as
torchrun sets it itself for more than one rank per node). The launchers start
``--stagger`` s apart (0.3) in node order: the first hosts the rendezvous store
(torch's c10d backend: the others find the port taken and connect to it). Every
run gets a fresh free port, run id and directory.

The training script is ``scripts/train.py`` (DDP over gloo on CPU, 50 ms steps, a
snapshot every 10 steps). All ranks, whatever their node, point at one
``--snapshot`` file (global rank 0 writes it, every rank of the next generation
loads it) and one ``--events`` file (each rank appends its milestones, wall clock
``time.time()``): on one machine the nodes share a disk. Global rank ``N-1`` (with
one rank per node: the last node in the rendezvous' order) crashes (``--crash-mode``,
default raise) at step ``--crash-at-step`` (160, ~8 s into training, so that
ft-supervisor's standby ranks have imported torch) in generation 0 only; every
node restarts once and generation 1 resumes from the snapshot for
``--steps-after`` more steps (40).

The variants are interleaved run by run (ft, torchrun, torchrun-noshare with 2
nodes, the same with 4 nodes, then again) so that a busy moment of the machine
hurts all of them alike.

Figures, per run:

* crash -> all stepping: the latest, over the ranks of all nodes, of each rank's
  first ``first_step`` after the ``crash``, minus the ``crash``. (After the crash,
  not of generation 1: torchrun's ``TORCHELASTIC_RESTART_COUNT`` is counted per
  agent, and the agents whose ranks did not fail restart theirs with it still 0;
  the notes say which ranks.) It covers the failing rank's
  exit, detection on its node, telling the other nodes (ft-supervisor: its job
  decision in the store; torchrun: the next rendezvous round, which the other
  agents see as a node waiting), stopping every node's surviving ranks, the new
  rendezvous round (``last_call_timeout`` included), starting the new ranks
  (python + ``import torch``, unless pre-started), gloo's rendezvous, loading the
  snapshot and one step.
* success: every node's launcher exited 0 and every rank wrote ``done`` after the
  crash. Timing, CPU and memory statistics use successful runs only (all finished
  runs when a variant had no success; the table marks that).
* peak RSS per node process: ``VmHWM`` of each launcher process itself (the ft-supervisor
  daemon, torchrun's agent), sampled every ~50 ms from ``/proc``; not its ranks.
  The median and the largest over every node of every run. ft-supervisor's own
  figure (``daemon_max_rss_kb`` of ``run_finished``) is cross-checked below the table.
  CPU per node process: utime+stime, read once it has exited, before it is reaped.
* for ft-supervisor, a breakdown from the daemons' event logs
  (``<log-dir>/<run id>/<stamp>/events.jsonl``): crash -> every node's
  ``job_decision`` for generation 0 -> every node's ``rendezvous_joined`` for
  generation 1 -> all stepping. Events that say something went wrong in a daemon
  (``internal_error``, ``rendezvous_leave_failed``, ...) are quoted.

Hygiene (as restart.py, through ``_common``): every launcher runs in its own session;
every run has a timeout (``--timeout``, 180 s; also stopped ``--stuck-after`` s,
60, after one node's launcher exited non-zero while others still run), after
which every running node's process group gets SIGTERM, then SIGKILL; this script
is a child subreaper, so whatever a launcher leaves behind is reparented here,
reported as a leftover and SIGKILLed (with its process group when it leads one:
ranks do). Ctrl-C (or SIGTERM) stops the current run the same way and prints
what was measured so far. Artifacts stay in ``--out`` (default: a fresh
temporary directory):
``<tool>-<N>n-<run>/node-<i>/launcher.out``, ``.../node-<i>/logs/``,
``<tool>-<N>n-<run>/events.jsonl``, ``results.json``.

Linux only (``/proc``, ``prctl``). Standard library only (the launchers and ranks
use the venv's torch).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    LEFTOVER_GRACE,
    STOP_GRACE,
    Interrupted,
    Launcher,
    become_subreaper,
    error_message,
    fmt,
    ft_event_log,
    has_exited,
    install_stop_handlers,
    kill_leftovers,
    killpg,
    median,
    read_jsonl,
    read_stat,
    signals_held,
)

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "scripts" / "train.py"
TOOLS = ("ft", "torchrun", "torchrun-noshare")
LABELS = {
    "ft": "ft-supervisor",
    "torchrun": "torchrun",
    "torchrun-noshare": "torchrun, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
}
# torchrun's workaround for pytorch/pytorch#135712: its ranks then use a store of their
# own (on global rank 0) instead of the rendezvous' store, which keeps the keys of the
# previous generation
ENV = {"torchrun-noshare": {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}}
SAMPLE_INTERVAL = 0.05  # launcher /proc sampling period
RDZV_CONF = "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=60"
# ft-supervisor events that say something went wrong in the daemon itself
TROUBLE = {
    "internal_error",
    "rendezvous_leave_failed",
    "rendezvous_fallback",  # torch's own rendezvous pace: not the figures of ours
    "control_failed",
    "control_dropped",
    "message_dropped",
    "plugin_failed",
    "state_unreadable",
    "state_unwritable",
    "reason_unwritable",
    "error_logs_unwritable",
    "rank_exit_stuck",
    "rank_unkillable",
    "stop_forced",
    "settings_ignored",
    "job_over",
}


# -- the launchers ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    runs: int
    node_counts: tuple[int, ...]
    tools: tuple[str, ...]
    crash_at_step: int
    steps_after: int
    step_time: float
    crash_mode: str
    stagger: float
    timeout: float
    stuck_after: float
    rdzv_conf: str
    out: Path


def free_port() -> int:
    """A port free on 127.0.0.1 now (the first node binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def train_args(s: Settings, run_dir: Path, nodes: int) -> list[str]:
    # one snapshot and one milestone file for the whole job: the nodes share this disk
    return [
        str(TRAIN),
        "--steps", str(s.crash_at_step + s.steps_after),
        "--step-time", str(s.step_time),
        "--snapshot", str(run_dir / "snapshot.pt"),
        "--crash-at-step", str(s.crash_at_step),
        "--crash-rank", str(nodes - 1),
        "--crash-generations", "0",
        "--crash-mode", s.crash_mode,
        "--events", str(run_dir / "events.jsonl"),
    ]  # fmt: skip


def node_argv(
    tool: str, s: Settings, *, run_dir: Path, node_dir: Path, nodes: int, port: int, run_id: str
) -> list[str]:
    common = [
        "--nnodes", str(nodes),
        "--nproc-per-node", "1",
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", run_id,
        "--local-addr", "127.0.0.1",
        "--rdzv-conf", s.rdzv_conf,
        "--max-restarts", "1",
        "--log-dir", str(node_dir / "logs"),
    ]  # fmt: skip
    launcher = ["-m", "torch.distributed.run"] if tool != "ft" else ["-m", "supervisor", "run"]
    return [sys.executable, *launcher, *common, *train_args(s, run_dir, nodes)]


# -- one run: N launchers ----------------------------------------------------------------------


@dataclass(slots=True)
class RunResult:
    tool: str
    nodes: int
    index: int
    run_dir: str
    run_id: str
    port: int
    exit_codes: list[int | None] = field(default_factory=list)
    still_running: list[int] = field(default_factory=list)  # nodes that had not exited at the timeout
    timed_out: bool = False  # we had to stop some nodes: see stopped
    stopped: str | None = None
    ok: bool = False
    restart_s: float | None = None
    peak_rss_kb: list[int | None] = field(default_factory=list)  # per node process
    cpu_s: list[float | None] = field(default_factory=list)
    reported_rss_kb: list[int | None] = field(default_factory=list)  # ft: run_finished
    crash_node: int | None = None  # ft: the node (in start order) that held global rank N-1
    crashes: int = 0  # crash milestones: more than one if a restarted rank crashed again
    stale_count_ranks: list[int] = field(default_factory=list)  # restarted with restart count 0
    decided_s: float | None = None  # ft: crash -> every node's job_decision of generation 0
    joined_s: float | None = None  # ft: crash -> every node's rendezvous_joined of generation 1
    standby_lead_s: float | None = None  # ft: last standby rank spawned this long before the crash
    trouble: list[str] = field(default_factory=list)  # ft: daemon events that say something went wrong
    failure: str | None = None
    leftovers: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def stop_all(launchers: list[Launcher], grace: float) -> None:
    """SIGTERM every launcher's group at once, SIGKILL what is left after ``grace``,
    reap them all. (Launcher.stop would give each its own grace, one after another.)"""
    live = [la for la in launchers if la.proc is not None and la.proc.returncode is None]
    # only those still running: what a launcher that exited by itself left behind is
    # for kill_leftovers to report
    stopping = [la for la in live if not has_exited(la.pid)]
    for la in stopping:
        killpg(la.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(not has_exited(la.pid) for la in stopping) and time.monotonic() < deadline:
        time.sleep(0.1)
    for la in stopping:
        # even once the launcher has exited: the rest of its group (pgid = its pid,
        # a zombie until reaped below) goes too
        killpg(la.pid, signal.SIGKILL)
    for la in live:
        assert la.proc is not None
        la.proc.wait()


def exit_status(pid: int) -> int | None:
    """The exit code (or -signal) of our exited child ``pid``, leaving it a zombie."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


@dataclass(slots=True)
class Failed:
    at: float  # monotonic
    node: int
    code: int | None


def watch(launchers: list[Launcher], started: float, s: Settings) -> tuple[set[int], Failed | None]:
    """Sample the running launchers until all have exited, the timeout passes, or some
    are still running ``stuck_after`` s after one failed; returns those still running."""
    deadline = started + s.timeout
    running = set(range(len(launchers)))
    failed: Failed | None = None
    while running and time.monotonic() < deadline:
        if failed is not None and time.monotonic() > failed.at + s.stuck_after:
            break
        for i in sorted(running):
            la = launchers[i]
            if not la.exited():
                la.sample()
                continue
            st = read_stat(la.pid)  # a zombie still has its final CPU times
            if st is not None:
                la.run.final_cpu_ticks = st.cpu_ticks
            la.run.wall_s = time.monotonic() - started
            running.discard(i)
            code = exit_status(la.pid)
            if code != 0 and failed is None:
                failed = Failed(time.monotonic(), i, code)
        time.sleep(SAMPLE_INTERVAL)
    return running, failed


def run_nodes(launchers: list[Launcher], s: Settings) -> tuple[str | None, list[str]]:
    """Start the launchers ``stagger`` apart and watch them; then stop all of them and
    what they left. Returns (why we had to stop some, leftovers)."""
    started = time.monotonic()
    try:
        for i, la in enumerate(launchers):
            if i:
                time.sleep(s.stagger)
            la.start()
        running, failed = watch(launchers, started, s)
    except BaseException:
        with signals_held():  # interrupted: stop everything now, without waiting
            stop_all(launchers, 1.0)
            kill_leftovers(0.0)
        raise
    why = None
    if running:
        why = (
            f"stopped {s.stuck_after:.0f} s after node {failed.node} exited {failed.code}"
            if failed is not None and time.monotonic() > failed.at + s.stuck_after
            else f"timed out after {s.timeout:.0f} s"
        )
    for i in running:
        launchers[i].run.timed_out = True
    with signals_held():
        stop_all(launchers, STOP_GRACE)
        leftovers = kill_leftovers(LEFTOVER_GRACE)
    for la in launchers:
        if la.proc is not None:
            la.run.exit_code = la.proc.returncode
        if la.run.timed_out:
            la.run.wall_s = time.monotonic() - started
    return why, leftovers


def run_once(tool: str, nodes: int, index: int, s: Settings) -> RunResult:
    run_dir = s.out / f"{tool}-{nodes}n-{index}"
    run_dir.mkdir(parents=True)
    port = free_port()
    run_id = f"bench-mn-{tool}-{nodes}n-{index}-{uuid.uuid4().hex[:8]}"
    r = RunResult(tool, nodes, index, str(run_dir), run_id, port)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **ENV.get(tool, {})}
    launchers = []
    for node in range(nodes):
        node_dir = run_dir / f"node-{node}"
        node_dir.mkdir()
        argv = node_argv(tool, s, run_dir=run_dir, node_dir=node_dir, nodes=nodes, port=port, run_id=run_id)
        launchers.append(Launcher(argv, node_dir, sample_interval=SAMPLE_INTERVAL, env=env))
    started = time.monotonic()
    r.stopped, r.leftovers = run_nodes(launchers, s)
    r.timed_out = r.stopped is not None
    r.wall_s = time.monotonic() - started
    r.exit_codes = [la.run.exit_code for la in launchers]
    r.still_running = [i for i, la in enumerate(launchers) if la.run.timed_out]
    r.peak_rss_kb = [None if la.run.timed_out else la.run.peak_hwm_kb or None for la in launchers]
    r.cpu_s = [la.run.cpu_s for la in launchers]
    analyse(r, run_dir, s)
    return r


# -- what a run left behind ----------------------------------------------------------------------


def after(events: list[dict[str, Any]], what: str, t0: float) -> dict[int, dict[str, Any]]:
    """Each rank's first ``what`` milestone after ``t0``. Not by generation: torchrun's
    TORCHELASTIC_RESTART_COUNT counts per agent, and an agent whose own ranks did not
    fail restarts them with the count unchanged (0 here)."""
    out: dict[int, dict[str, Any]] = {}
    for e in sorted(events, key=lambda e: e["t"]):
        if e["event"] == what and e["t"] > t0:
            out.setdefault(e["rank"], e)
    return out


def last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no output)"
    return lines[-1][:200] if lines else "(no output)"


def failure_of(r: RunResult, run_dir: Path, s: Settings, done: int) -> str:
    parts = []
    if r.timed_out:
        parts.append(f"{r.stopped}, nodes {r.still_running} still running")
    bad = [i for i, code in enumerate(r.exit_codes) if code != 0 and i not in r.still_running]
    if not bad and not r.timed_out:
        return f"{done}/{r.nodes} ranks finished after the crash"
    for i in bad:
        node_dir = run_dir / f"node-{i}"
        why = error_message(node_dir, limit=200) or last_line(node_dir / "launcher.out")
        parts.append(f"node {i} exit {r.exit_codes[i]}: {why}")
    return "; ".join(parts)


def analyse(r: RunResult, run_dir: Path, s: Settings) -> None:
    events = read_jsonl(run_dir / "events.jsonl")
    crashes = sorted(e["t"] for e in events if e["event"] == "crash")
    crash = crashes[0] if crashes else None
    first = after(events, "first_step", crash) if crash is not None else {}
    done = after(events, "done", crash) if crash is not None else {}
    if crash is not None and len(first) == r.nodes:
        r.restart_s = max(e["t"] for e in first.values()) - crash
    r.crashes = len(crashes)
    r.stale_count_ranks = sorted(rank for rank, e in first.items() if e["generation"] == 0)
    r.ok = (
        not r.timed_out
        and all(code == 0 for code in r.exit_codes)
        and len(done) == r.nodes
        and r.restart_s is not None
    )
    if not r.ok:
        r.failure = failure_of(r, run_dir, s, len(done))
    if r.tool == "ft":
        ft_details(r, [ft_events(run_dir / f"node-{i}") for i in range(r.nodes)], crash)


def ft_events(node_dir: Path) -> list[dict[str, Any]]:
    path = ft_event_log(node_dir / "logs")
    return read_jsonl(path) if path is not None else []


def latest(per_node: list[list[dict[str, Any]]], event: str, generation: int) -> float | None:
    """The time of ``event`` for ``generation`` on the last node to log it; None unless
    every node logged it."""
    times = []
    for fte in per_node:
        found = [e["t_wall"] for e in fte if e["event"] == event and e.get("generation") == generation]
        if not found:
            return None
        times.append(min(found))
    return max(times)


def ft_details(r: RunResult, per_node: list[list[dict[str, Any]]], crash: float | None) -> None:
    for node, fte in enumerate(per_node):
        joined = next(
            (e for e in fte if e["event"] == "rendezvous_joined" and e.get("generation") == 0), None
        )
        if joined is not None and joined.get("node_rank") == r.nodes - 1:
            r.crash_node = node
        finish = next((e for e in fte if e["event"] == "run_finished"), None)
        r.reported_rss_kb.append(None if finish is None else finish.get("daemon_max_rss_kb"))
        for e in fte:
            name = e["event"]
            if name in TROUBLE or (name != "rank_failure_reported" and ("error" in name or "failed" in name)):
                detail = {k: v for k, v in e.items() if k not in {"event", "t_wall", "t_mono", "run_id"}}
                r.trouble.append(f"node {node}: {name} {json.dumps(detail)[:300]}")
    if crash is None:
        return
    decided = latest(per_node, "job_decision", 0)
    joined = latest(per_node, "rendezvous_joined", 1)
    r.decided_s = None if decided is None else decided - crash
    r.joined_s = None if joined is None else joined - crash
    standby = [
        e["t_wall"] for fte in per_node for e in fte if e["event"] == "rank_spawned" and e.get("standby")
    ]
    r.standby_lead_s = crash - max(standby) if standby else None


# -- the table -------------------------------------------------------------------------------------


def basis(results: list[RunResult]) -> tuple[list[RunResult], bool]:
    """Runs to take CPU and memory from: the successful ones, else all that finished."""
    ok = [r for r in results if r.ok]
    return (ok, False) if ok else ([r for r in results if not r.timed_out], True)


def restart_median(rs: Iterable[RunResult]) -> float | None:
    return median(r.restart_s for r in rs if r.ok)


def reference(results: list[RunResult], nodes: int) -> tuple[float | None, bool]:
    """torchrun's median restart time with ``nodes`` nodes; when torchrun as shipped never
    recovered, its workaround's (second item: True)."""
    for tool in ("torchrun", "torchrun-noshare"):
        ref = restart_median(r for r in results if r.tool == tool and r.nodes == nodes)
        if ref is not None:
            return ref, tool != "torchrun"
    return None, False


def row(tool: str, nodes: int, rs: list[RunResult], ref: float | None, workaround: bool) -> str:
    times = [r.restart_s for r in rs if r.ok and r.restart_s is not None]
    med = median(times)
    span = f"{fmt(med)} ({fmt(min(times))}-{fmt(max(times))})" if times else "n/a"
    ratio = fmt(med / ref) + ("‡" if workaround else "") if med is not None and ref else "n/a"
    use, fallback = basis(rs)
    mark = "†" if fallback and use else ""
    rss = [kb / 1024 for r in use for kb in r.peak_rss_kb if kb is not None]
    rss_text = f"{fmt(median(rss), 1)} ({fmt(max(rss), 1)})" if rss else "n/a"
    cpu = median(c for r in use for c in r.cpu_s)
    return (
        f"| {LABELS[tool]} | {nodes} | {sum(r.ok for r in rs)}/{len(rs)}{mark} | {span} | {ratio} "
        f"| {rss_text} | {fmt(cpu)} |"
    )


def table(results: list[RunResult], s: Settings) -> str:
    rows = [
        "| launcher | nodes | restarts ok | crash -> all stepping median (min-max) s "
        "| ratio vs torchrun (same nodes) | peak RSS per node process MiB median (max) "
        "| CPU s per node process |",
        "|---|---|---|---|---|---|---|",
    ]
    for nodes in s.node_counts:
        ref, workaround = reference(results, nodes)
        for tool in s.tools:
            rs = [r for r in results if r.tool == tool and r.nodes == nodes]
            if rs:
                rows.append(row(tool, nodes, rs, ref, workaround))
    return "\n".join(rows)


def breakdown(results: list[RunResult], s: Settings) -> list[str]:
    out = []
    for nodes in s.node_counts:
        rs = [r for r in results if r.tool == "ft" and r.nodes == nodes and r.ok]
        if rs:
            out.append(
                f"- ft-supervisor, {nodes} nodes (medians): crash -> every node decided "
                f"{fmt(median(r.decided_s for r in rs))} s -> every node joined round 1 "
                f"{fmt(median(r.joined_s for r in rs))} s -> all stepping "
                f"{fmt(restart_median(rs))} s (standby ranks spawned "
                f"{fmt(median(r.standby_lead_s for r in rs), 1)} s before the crash)."
            )
    return out


def label(r: RunResult) -> str:
    return f"{LABELS[r.tool]} {r.nodes} nodes run {r.index}"


def notes(results: list[RunResult]) -> list[str]:
    out = []
    for r in results:
        if not r.ok:
            out.append(f"- {label(r)} failed: {r.failure}")
        if r.leftovers:
            # after a timeout we SIGKILLed the launchers ourselves: not their fault then
            what = "still ran after the timeout kill" if r.timed_out else "were left behind by the launchers"
            out.append(f"- {label(r)}: processes {what}: {'; '.join(r.leftovers)}")
        if r.crash_node is not None and r.crash_node != r.nodes - 1:
            out.append(f"- {label(r)}: the crashing rank was on node {r.crash_node} (start order)")
        if r.crashes > 1:
            out.append(
                f"- {label(r)}: {r.crashes} crash milestones: a restarted rank crashed again "
                "(its TORCHELASTIC_RESTART_COUNT was still 0)"
            )
        if r.stale_count_ranks:
            out.append(
                f"- {label(r)}: after the restart, ranks {r.stale_count_ranks} stepped with "
                "TORCHELASTIC_RESTART_COUNT=0 (their node's agent did not count the restart)"
            )
        if r.tool == "ft" and r.standby_lead_s is not None and r.standby_lead_s < 3.0:
            out.append(
                f"- {label(r)}: standby ranks spawned only {r.standby_lead_s:.1f} s before the crash: "
                "they may still have been importing torch (raise --crash-at-step)"
            )
        out.extend(f"- {label(r)}: {t}" for t in r.trouble)
    out.extend(cross_check(results))
    return out


def cross_check(results: list[RunResult]) -> list[str]:
    """Compare our /proc samples with the peak RSS each daemon reports about itself."""
    out, checked = [], 0
    for r in results:
        for node, (sampled, reported) in enumerate(zip(r.peak_rss_kb, r.reported_rss_kb, strict=False)):
            if sampled is None or reported is None:
                continue
            checked += 1
            if abs(sampled - reported) > max(1024, 0.05 * reported):
                out.append(
                    f"- {label(r)} node {node}: sampled peak RSS {sampled / 1024:.1f} MiB, "
                    f"the daemon reports {reported / 1024:.1f} MiB"
                )
    if checked and not out:
        out.append(
            f"- ft-supervisor's self-reported peak RSS (run_finished) agrees with the /proc samples "
            f"for all {checked} daemons (within 5%)."
        )
    return out


def report(results: list[RunResult], s: Settings) -> None:
    print(table(results, s))
    print()
    print(
        f"One rank per node, N launchers on this machine over loopback (c10d rendezvous, "
        f"--rdzv-conf {s.rdzv_conf}, --max-restarts 1). Global rank N-1 crashes ({s.crash_mode}) at "
        f"step {s.crash_at_step} of generation 0; {s.step_time * 1000:.0f} ms steps, {s.steps_after} "
        "steps after the restart.\n"
        "crash -> all stepping: the crash milestone -> the last rank's first step after it, over all "
        "nodes; successful runs only (every launcher exited 0, every rank done after the crash). "
        "Ratio: median / torchrun's median with the same node count (‡ torchrun as shipped never "
        "recovered: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1's median).\n"
        "Peak RSS (VmHWM) and CPU: each launcher process alone (daemon / agent), not its ranks; "
        "medians over every node of the successful runs († none succeeded: all finished runs).\n"
        f"Artifacts: {s.out}"
    )
    extra = breakdown(results, s) + notes(results)
    if extra:
        print()
        print("\n".join(extra))
    sys.stdout.flush()


# -- main --------------------------------------------------------------------------------------------


def csv_of(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=None, help="runs per variant (default 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="1 run, 10 steps after the restart: a smoke test")
    p.add_argument("--nodes", default="2,4", help="comma-separated node counts (default 2,4)")
    p.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of ft,torchrun")
    p.add_argument("--crash-at-step", type=int, default=160, help="late enough for standbys to be warm")
    p.add_argument("--steps-after", type=int, default=None, help="steps after the restart (default 40)")
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--crash-mode", choices=["raise", "exit", "abort", "segv"], default="raise")
    p.add_argument("--stagger", type=float, default=0.3, help="seconds between starting two nodes")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds before a run is killed")
    p.add_argument(
        "--stuck-after",
        type=float,
        default=60.0,
        help="stop a run this many seconds after a node's launcher exited non-zero while others run",
    )
    p.add_argument("--rdzv-conf", default=RDZV_CONF, help="--rdzv-conf for both tools")
    p.add_argument("--out", type=Path, default=None, help="artifact directory (default: a fresh tempdir)")
    a = p.parse_args(argv)
    tools = tuple(csv_of(a.tools))
    if not tools or any(t not in TOOLS for t in tools):
        p.error(f"--tools: choose from {', '.join(TOOLS)}")
    try:
        node_counts = tuple(int(n) for n in csv_of(a.nodes))
    except ValueError:
        p.error("--nodes: integers, e.g. 2,4")
    if not node_counts or min(node_counts) < 2:
        p.error("--nodes: at least 2 nodes")
    needed = {"torch": "torch", **({"supervisor": "ft-supervisor"} if "ft" in tools else {})}
    for module, what in needed.items():
        if importlib.util.find_spec(module) is None:
            p.error(f"{what} is not importable by {sys.executable}: run with the project's .venv/bin/python")
    runs = a.runs if a.runs is not None else 1 if a.quick else 3
    if runs < 1:
        p.error("--runs must be at least 1")
    out = a.out or Path(tempfile.mkdtemp(prefix="ft-bench-multinode-"))
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        p.error(f"--out {out} is not empty: give a fresh directory")
    steps_after = a.steps_after if a.steps_after is not None else 10 if a.quick else 40
    return Settings(
        runs, node_counts, tools, a.crash_at_step, steps_after, a.step_time, a.crash_mode, a.stagger,
        a.timeout, a.stuck_after, a.rdzv_conf, out.resolve(),
    )  # fmt: skip


def schedule(s: Settings) -> Iterator[tuple[int, int, str]]:
    for index in range(1, s.runs + 1):
        for nodes in s.node_counts:
            for tool in s.tools:
                yield index, nodes, tool


def describe(r: RunResult) -> str:
    status = "ok" if r.ok else "FAILED"
    rss = [kb for kb in r.peak_rss_kb if kb is not None]
    return (
        f"{label(r):<32} {status:<6} crash -> all stepping {fmt(r.restart_s)} s, "
        f"rss max {fmt(max(rss) / 1024 if rss else None, 1)} MiB, exits {r.exit_codes}, wall {r.wall_s:.1f} s"
        + (f" ({r.failure})" if r.failure else "")
    )


def main(argv: list[str] | None = None, progress: Callable[[str], None] = lambda m: None) -> int:
    s = parse_args(argv)
    become_subreaper()
    install_stop_handlers()
    results: list[RunResult] = []
    code = 0
    started = time.monotonic()
    try:
        # the first `import torch` after a while reads torch from disk: not in a timed run
        subprocess.run([sys.executable, "-c", "import torch"], check=False, timeout=s.timeout)
        for index, nodes, tool in schedule(s):
            r = run_once(tool, nodes, index, s)
            results.append(r)
            progress(describe(r))
    except (KeyboardInterrupt, Interrupted) as exc:
        progress(f"interrupted ({type(exc).__name__} {exc}): reporting the {len(results)} finished runs")
        with signals_held():
            kill_leftovers(0.0)  # a safety net: whatever of ours still runs goes now
        code = 130
    with contextlib.suppress(OSError):
        (s.out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    progress(f"total wall time {time.monotonic() - started:.0f} s")
    if results:
        report(results, s)
    return code


if __name__ == "__main__":
    sys.exit(main(progress=lambda m: print(m, file=sys.stderr, flush=True)))
