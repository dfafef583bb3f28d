"""Hang-detection benchmark: what ft-supervisor's eyes cost, and how fast they see.

How to run (from the repository root, in the project's virtualenv)::

    .venv/bin/python scripts/bench/hang.py                   # everything, ~4 minutes
    .venv/bin/python scripts/bench/hang.py --quick           # a smoke run, ~1.5 minutes
    .venv/bin/python scripts/bench/hang.py --parts cost,detect --out /tmp/bench-hang

Prints one Markdown table; artifacts (every launcher's command line and output, the
daemon's event logs, the ranks' logs and raw samples, results.json) stay in
``--out`` (default: a fresh temporary directory). Every part runs real ranks
under a real daemon (``ft-supervisor run``, found next to this python):

1. ``cost``: the in-rank cost of ``client.heartbeat()`` and of a monitored section
   open+close pair (``start_section("step"); end_section("step")`` under
   ``--ft-rank-section-timeouts step:60``), timed with ``time.perf_counter_ns``
   around each call, ``--calls`` of each, inside one rank
   (``scripts/bench/_hang_probe.py cost``, ``--preload none``). Next to them, the
   floor: a raw pyzmq DEALER of the rank's own (the client's socket options) doing
   ``send(prebuilt_bytes, zmq.NOBLOCK)`` of the same small orjson message to the
   same daemon socket (and, the floor of a section call, ``orjson.dumps`` + send).
   Two regimes: *paced*, a ``--gap-us`` sleep before every call with the kinds
   interleaved in a shuffled order (as in training: each send finds the socket
   idle, so ZeroMQ must wake its I/O thread), and *back-to-back*, one kind's calls
   in a tight loop, in blocks of ``--burst`` (1000) with a 0.1 s pause between
   them so that the daemon drains its queue and no send is dropped (sends only
   enqueue; this is how a microbenchmark of a raw send usually runs). Medians
   and p99s in microseconds.
2. ``detect``: detection excess, how long after a rank's deadline the daemon
   declares it hung. One rank (``_hang_probe.py hang``) heartbeats every 10 ms for
   ``--hang-after`` s, then hangs in ``time.sleep``, in every generation;
   ``--ft-rank-heartbeat-timeout 0.5 --max-restarts HANGS-1``: each generation's
   hang is one sample. The excess is the daemon's own ``late_by`` (``rank_hung``
   event in ``<log-dir>/<run-id>/<stamp>/events.jsonl``), cross-checked from the rank
   side: the rank records (``time.time()``) when its last heartbeat left, and
   excess = the event's ``t_wall`` - (last heartbeat + timeout); this one also
   includes the message's trip to the daemon. The second variant holds ``step``
   open instead (``--ft-rank-section-timeouts step:0.5``, opened and closed every
   10 ms, then opened for good; ``--ft-learn-timeouts false`` so that the
   configured 0.5 s stays in force in every generation).
3. ``load``: the daemon's CPU and RSS while ``--load-ranks`` ranks (8) send
   ``--load-rate`` heartbeats/s each (100) for ``--load-duration`` s (30),
   ``--preload none``, heartbeat timeout 30 s. CPU: sampled from
   ``/proc/<daemon>/stat`` every 50 ms, over the window in which all ranks were
   heartbeating (and the daemon's whole-run figures from its ``run_finished``
   event: ``daemon_cpu_s``, ``daemon_max_rss_kb``); RSS: ``VmHWM`` from
   ``/proc/<daemon>/status``. Messages received and dropped: ``ft-supervisor status
   --json --pid PID`` once halfway through and once after every rank has sent its
   last heartbeat (the ranks then wait, alive, until that call is done), compared
   with what the ranks say they sent. Before it, an idle baseline
   (``--load-idle-duration`` s): the same ranks, connected but silent, so that the
   daemon's CPU per message can be told apart from what it spends anyway.
4. ``restart``: from a hang's deadline to every rank stepping again. Two ranks of
   ``_hang_rank.py`` (DDP over gloo on CPU, 50 ms steps, a heartbeat per step, as
   in scripts/train.py); rank 1 hangs at step ``--restart-hang-step`` (160, ~8 s in:
   the standby ranks of generation 1 have imported torch by then) of generation
   0; ``--ft-rank-heartbeat-timeout 2 --max-restarts 1``. Time = the latest
   ``first_step`` of generation 1 minus the deadline, rank 1's last heartbeat +
   timeout (rank side); the daemon's view of the deadline (``t_wall - late_by``
   of the first ``rank_hung``) is shown too, with a breakdown. Median over
   ``--restart-runs`` runs.

nvidia-resiliency-ext 0.4.1 figures are quoted from the issue, not measured here.

Hygiene (as restart.py): every launcher runs in its own session and has a timeout,
after which its process group gets SIGTERM, then SIGKILL; this script is a child
subreaper, so whatever a launcher leaves behind is reparented here, reported and
SIGKILLed (with its process group when it leads one). Ctrl-C or SIGTERM stops the
current run the same way and prints what was measured so far.

Linux only (``/proc``, ``prctl``). Standard library only (the ranks use pyzmq,
orjson and torch from the venv).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    Interrupted,
    Launcher,
    LauncherRun,
    become_subreaper,
    fmt,
    ft_event_log,
    install_stop_handlers,
    kill_leftovers,
    median,
    percentile,
    read_jsonl,
    signals_held,
)

HERE = Path(__file__).resolve().parent
PROBE = HERE / "_hang_probe.py"
RANK_SCRIPT = HERE / "_hang_rank.py"
PARTS = ("cost", "detect", "load", "restart")
COST_KINDS = ("heartbeat", "floor_send", "section", "floor_dumps_send")
HANG_RANK = 1
STATUS_TIMEOUT = 15.0
RSS_TARGET_KB = 40 * 1024

# nvidia-resiliency-ext 0.4.1, quoted from the issue (not measured here)
NVRX = {
    "heartbeat": "108-170 µs (waits for the monitor's reply)",
    "floor_send": "raw pyzmq send of an orjson message: 1.1-5.3 µs",
    "section": "259-374 µs",
    "detect": "5 s check interval (default): median 3.4 s, max 4.7 s; 0.1 s: 30-110 ms",
    "rss": "216 MB launcher, plus a monitor process per rank",
}


@dataclass(frozen=True, slots=True)
class Settings:
    out: Path
    bin_dir: Path
    parts: tuple[str, ...]
    calls: int
    warmup: int
    gap_us: float
    burst: int
    hangs: int
    hang_timeout: float
    hang_after: float
    hang_interval: float
    load_ranks: int
    load_rate: float
    load_duration: float
    load_idle_duration: float
    restart_runs: int
    restart_hang_step: int
    restart_steps_after: int
    restart_heartbeat_timeout: float
    timeout_scale: float


# -- running the daemon ------------------------------------------------------------------


def ft_argv(s: Settings, run_dir: Path, name: str, options: list[str], program: list[str]) -> list[str]:
    return [
        str(s.bin_dir / "ft-supervisor"), "run",
        "--rdzv-id", f"bench-hang-{name}-{uuid.uuid4().hex[:8]}",
        "--log-dir", str(run_dir / "logs"),
        *options, *program,
    ]  # fmt: skip


def launch(
    argv: list[str], run_dir: Path, timeout: float, during: Callable[[Launcher], None] | None = None
) -> LauncherRun:
    """Run one launcher to its end (or its timeout), sampling it; ``during`` is
    called every ~0.25 s while it runs."""
    run_dir.mkdir(parents=True, exist_ok=True)
    launcher = Launcher(argv, run_dir)
    launcher.start()
    deadline = time.monotonic() + timeout
    try:
        while not launcher.poll(0.25, deadline) and time.monotonic() < deadline:
            if during is not None:
                during(launcher)
    except BaseException:
        launcher.abort()  # interrupted: stop it and all it left now, without waiting
        raise
    launcher.finish(deadline)  # stops it (and all it left) after a timeout
    return launcher.run


def events_of(run_dir: Path) -> list[dict[str, Any]]:
    path = ft_event_log(run_dir / "logs")
    return read_jsonl(path) if path is not None else []


def finished(events: list[dict[str, Any]]) -> dict[str, Any]:
    return next((e for e in events if e["event"] == "run_finished"), {})


def drops_seen(events: list[dict[str, Any]]) -> list[str]:
    return [f"{e.get('reason')}: {e.get('detail')}" for e in events if e["event"] == "message_dropped"]


def run_problem(run: LauncherRun, expected_exit: int) -> str | None:
    if run.timed_out:
        return f"timed out after {run.wall_s:.0f} s"
    if run.exit_code != expected_exit:
        return f"exit code {run.exit_code} (expected {expected_exit})"
    return None


# -- 1: cost of a call ------------------------------------------------------------------


@dataclass(slots=True)
class CostResult:
    run_dir: str
    problem: str | None = None
    calls: int = 0
    # regime -> kind -> (median us, p99 us)
    stats: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    dropped: dict[str, dict[str, int]] = field(default_factory=dict)  # regime -> socket -> sends
    step_monitored: bool | None = None
    daemon_drops: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)


def measure_cost(s: Settings) -> CostResult:
    run_dir = s.out / "cost"
    out = run_dir / "cost.json"
    options = ["--nproc-per-node", "1", "--preload", "none", "--ft-rank-section-timeouts", "step:60"]
    program = [
        str(PROBE), "cost", str(out),
        "--calls", str(s.calls), "--warmup", str(s.warmup), "--gap-us", str(s.gap_us),
        "--burst", str(s.burst),
    ]  # fmt: skip
    calls = s.calls + s.warmup
    timeout = (60 + calls * 6 * (s.gap_us * 1e-6 + 300e-6) * 2 + calls / s.burst * 6 * 0.2) * s.timeout_scale
    run = launch(ft_argv(s, run_dir, "cost", options, program), run_dir, timeout)
    r = CostResult(str(run_dir), run_problem(run, 0), leftovers=run.leftovers)
    r.daemon_drops = drops_seen(events_of(run_dir))
    if not out.exists():
        r.problem = r.problem or "the rank wrote no results"
        return r
    data = json.loads(out.read_text())
    r.calls = data["calls"]
    r.dropped = data["dropped"]
    r.step_monitored = data["step_monitored"]
    for regime in ("paced", "burst"):
        r.stats[regime] = {}
        for kind, ns in data[f"{regime}_ns"].items():
            us = [x / 1000 for x in ns]
            r.stats[regime][kind] = (median(us) or 0.0, percentile(us, 99) or 0.0)
    return r


# -- 2: detection excess ------------------------------------------------------------------


@dataclass(slots=True)
class DetectResult:
    kind: str
    run_dir: str
    problem: str | None = None
    timeout: float = 0.0
    late_by_ms: list[float] = field(default_factory=list)  # the daemon's own figure
    rank_side_ms: list[float] = field(default_factory=list)  # t_wall - (last sign of life + timeout)
    wrong_kind: list[str] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # generations with a hang but no rank_hung
    daemon_drops: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)


def noticed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The moments deadlines were noticed: ``deadline_missed`` (the daemon then names the
    hung rank from every rank's stacks, ``rank_hung``); older daemons only had ``rank_hung``."""
    missed = [e for e in events if e["event"] == "deadline_missed"]
    return missed or [e for e in events if e["event"] == "rank_hung"]


def measure_detection(s: Settings, kind: str) -> DetectResult:
    run_dir = s.out / f"detect-{kind}"
    out = run_dir / "hang.jsonl"
    # a hang three times on one node reschedules by default (the HANG rule's repeat); here
    # every generation hangs on purpose, so the rule is replaced for this run
    rules = run_dir / "hang-restarts.toml"
    rules.parent.mkdir(parents=True, exist_ok=True)
    rules.write_text('[[rule]]\nid = "HANG"\nhang = true\ncategory = "hang"\naction = "restart"\n')
    options = ["--nproc-per-node", "1", "--preload", "none", "--max-restarts", str(s.hangs - 1),
               "--rules", str(rules)]  # fmt: skip
    if kind == "heartbeat":
        options += ["--ft-rank-heartbeat-timeout", str(s.hang_timeout)]
    else:
        options += ["--ft-rank-section-timeouts", f"step:{s.hang_timeout}", "--ft-learn-timeouts", "false"]
    program = [
        str(PROBE), "hang", str(out), "--kind", kind,
        "--interval", str(s.hang_interval), "--hang-after", str(s.hang_after),
    ]  # fmt: skip
    timeout = (60 + s.hangs * (s.hang_after + s.hang_timeout + 5)) * s.timeout_scale
    run = launch(ft_argv(s, run_dir, f"detect-{kind}", options, program), run_dir, timeout)
    # restarts run out after the last hang: a hang is transient, so the daemon reschedules (200)
    r = DetectResult(kind, str(run_dir), run_problem(run, 200), s.hang_timeout, leftovers=run.leftovers)
    events = events_of(run_dir)
    r.daemon_drops = drops_seen(events)
    hung = {e["generation"]: e for e in noticed(events)}
    expected = "heartbeat" if kind == "heartbeat" else "section"
    for line in read_jsonl(out):
        g = line["generation"]
        e = hung.get(g)
        if e is None:
            r.missing.append(g)
            continue
        if e["kind"] != expected:
            r.wrong_kind.append(f"generation {g}: {e['kind']} {e.get('section')}")
            continue
        r.late_by_ms.append(e["late_by"] * 1000)
        r.rank_side_ms.append((e["t_wall"] - (line["last_t"] + e["timeout"])) * 1000)
    if len(r.late_by_ms) < s.hangs and r.problem is None:
        r.problem = f"{len(r.late_by_ms)} of {s.hangs} hangs measured"
    return r


# -- 3: the daemon under load ---------------------------------------------------------------


@dataclass(slots=True)
class LoadResult:
    run_dir: str
    rate: float
    problem: str | None = None
    window_s: float | None = None
    cpu_window_s: float | None = None
    cpu_total_s: float | None = None  # sampled, whole run
    reported_cpu_s: float | None = None  # run_finished
    peak_hwm_kb: int | None = None
    reported_rss_kb: int | None = None
    rss_end_kb: int | None = None  # VmRSS at the end of the window
    sent: int = 0
    client_dropped: int = 0
    schedule_late_max_s: float = 0.0
    status_mid: dict[str, Any] | None = None
    status_end: dict[str, Any] | None = None
    status_errors: list[str] = field(default_factory=list)
    daemon_drops: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)

    @property
    def received(self) -> int | None:
        return None if self.status_end is None else self.status_end.get("received")

    @property
    def dropped(self) -> int | None:
        if self.status_end is None:
            return None
        counts: dict[str, int] = self.status_end.get("dropped") or {}
        return sum(counts.values())


def ft_status(s: Settings, pid: int) -> tuple[dict[str, Any] | None, str | None]:
    argv = [str(s.bin_dir / "ft-supervisor"), "status", "--json", "--pid", str(pid)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=STATUS_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return None, f"`ft-supervisor status` did not return within {STATUS_TIMEOUT:g} s"
    if done.returncode != 0:
        return None, f"`ft-supervisor status` exit {done.returncode}: {done.stderr.strip()[:200]}"
    try:
        return json.loads(done.stdout), None
    except json.JSONDecodeError:
        return None, f"`ft-supervisor status` printed no JSON: {done.stdout[:200]!r}"


def measure_load(s: Settings, rate: float, duration: float, name: str) -> LoadResult:
    run_dir = s.out / name
    prefix = run_dir / "load"
    release = run_dir / "release"
    n = s.load_ranks
    options = [
        "--nproc-per-node", str(n), "--preload", "none", "--ft-rank-heartbeat-timeout", "30",
    ]  # fmt: skip
    program = [
        str(PROBE), "load", str(prefix), "--rate", str(rate), "--duration", str(duration),
        "--release", str(release), "--release-timeout", "20",
    ]  # fmt: skip
    r = LoadResult(str(run_dir), rate)
    started: list[float] = []
    asked: list[str] = []

    def during(launcher: Launcher) -> None:
        if not started:
            gen = [e for e in events_of(run_dir) if e["event"] == "generation_started"]
            if gen:
                started.append(gen[0]["t_wall"])
        elif not asked and time.time() > started[0] + 1 + duration / 2:
            asked.append("halfway")
            r.status_mid, err = ft_status(s, launcher.pid)
            if err:
                r.status_errors.append(f"halfway: {err}")
        if not release.exists() and len(list(run_dir.glob("load.rank*.json"))) == n:
            launcher.sample()
            r.status_end, err = ft_status(s, launcher.pid)
            if err:
                r.status_errors.append(f"at the end: {err}")
            release.touch()

    timeout = (duration + 90) * s.timeout_scale
    run = launch(ft_argv(s, run_dir, name, options, program), run_dir, timeout, during)
    r.problem = run_problem(run, 0)
    r.leftovers = run.leftovers
    events = events_of(run_dir)
    r.daemon_drops = drops_seen(events)
    fin = finished(events)
    r.reported_cpu_s = fin.get("daemon_cpu_s")
    r.reported_rss_kb = fin.get("daemon_max_rss_kb")
    r.peak_hwm_kb = run.peak_hwm_kb or None
    r.cpu_total_s = run.cpu_s
    ranks = [json.loads(p.read_text()) for p in sorted(run_dir.glob("load.rank*.json"))]
    if len(ranks) != n:
        r.problem = r.problem or f"{len(ranks)} of {n} ranks reported"
        return r
    r.sent = sum(x["sent"] for x in ranks)
    r.client_dropped = sum(x["client_dropped"] for x in ranks)
    r.schedule_late_max_s = max(x["schedule_late_max_s"] for x in ranks)
    t0 = max(x["t_start"] for x in ranks)
    t1 = min(x["t_end"] for x in ranks)
    r.window_s = t1 - t0
    r.cpu_window_s = run.cpu_between(t0, t1)
    inside = [x for x in run.samples if t0 <= x.t_wall <= t1 and x.rss_kb is not None]
    r.rss_end_kb = inside[-1].rss_kb if inside else None
    if r.status_end is None and r.problem is None:
        r.problem = "no status taken at the end of the load"
    return r


# -- 4: deadline -> stepping again ------------------------------------------------------------


@dataclass(slots=True)
class RestartResult:
    index: int
    run_dir: str
    problem: str | None = None
    deadline_to_steps_s: float | None = None  # rank side: last heartbeat + timeout
    daemon_deadline_to_steps_s: float | None = None  # rank_hung: t_wall - late_by
    detect_s: float | None = None  # deadline (rank side) -> rank_hung
    hung_to_ended_s: float | None = None  # rank_hung -> generation_ended (stacks, kill)
    ended_to_started_s: float | None = None  # generation_ended -> generation 1 started
    started_to_steps_s: float | None = None  # generation 1 started -> all ranks stepped
    standby_lead_s: float | None = None  # standby ranks spawned this long before the hang
    hung_ranks: list[int] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)


def measure_restart(s: Settings, index: int) -> RestartResult:
    run_dir = s.out / f"restart-{index}"
    milestones = run_dir / "milestones.jsonl"
    steps = s.restart_hang_step + s.restart_steps_after
    options = [
        "--nproc-per-node", "2", "--max-restarts", "1",
        "--ft-rank-heartbeat-timeout", str(s.restart_heartbeat_timeout),
    ]  # fmt: skip
    program = [
        str(RANK_SCRIPT), "--steps", str(steps), "--hang-at-step", str(s.restart_hang_step),
        "--hang-rank", str(HANG_RANK), "--events", str(milestones),
    ]  # fmt: skip
    timeout = (120 + steps * 0.05 * 2) * s.timeout_scale
    run = launch(ft_argv(s, run_dir, "restart", options, program), run_dir, timeout)
    r = RestartResult(index, str(run_dir), run_problem(run, 0), leftovers=run.leftovers)
    marks = read_jsonl(milestones)
    events = events_of(run_dir)
    hang = next((m for m in marks if m["event"] == "hang" and m["generation"] == 0), None)
    first = [m["t"] for m in marks if m["event"] == "first_step" and m["generation"] == 1]
    hung = [e for e in events if e["event"] == "rank_hung" and e["generation"] == 0]
    r.hung_ranks = [e["rank"] for e in hung]
    if hang is None or hang.get("last_heartbeat") is None or len(first) != 2 or not hung:
        r.problem = r.problem or (
            "no hang milestone" if hang is None else f"generation 1 stepped on {len(first)}/2 ranks"
        )
        return r
    deadline = hang["last_heartbeat"] + s.restart_heartbeat_timeout
    missed = [e for e in noticed(events) if e["generation"] == 0] or hung
    daemon_deadline = missed[0]["t_wall"] - missed[0]["late_by"]
    stepped = max(first)
    r.deadline_to_steps_s = stepped - deadline
    r.daemon_deadline_to_steps_s = stepped - daemon_deadline
    r.detect_s = missed[0]["t_wall"] - deadline
    ended = next((e for e in events if e["event"] == "generation_ended" and e["generation"] == 0), None)
    gen1 = next((e for e in events if e["event"] == "generation_started" and e["generation"] == 1), None)
    if ended is not None:
        r.hung_to_ended_s = ended["t_wall"] - hung[0]["t_wall"]
        if gen1 is not None:
            r.ended_to_started_s = gen1["t_wall"] - ended["t_wall"]
    if gen1 is not None:
        r.started_to_steps_s = stepped - gen1["t_wall"]
    standby = [e["t_wall"] for e in events if e["event"] == "rank_spawned" and e.get("standby")]
    r.standby_lead_s = hang["t"] - max(standby) if standby else None
    return r


# -- the table -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Results:
    cost: CostResult | None = None
    detect: list[DetectResult] = field(default_factory=list)
    load_idle: LoadResult | None = None
    load: LoadResult | None = None
    restart: list[RestartResult] = field(default_factory=list)


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else "ok" if ok else "**missed**"


COST_LABELS = {
    "heartbeat": "`client.heartbeat()`",
    "floor_send": "floor: raw DEALER `send(prebuilt, NOBLOCK)`",
    "section": "section open+close (`step` monitored)",
    "floor_dumps_send": "floor of a section call: `orjson.dumps` + send",
}
COST_TARGETS = {"heartbeat": 5.0, "section": 10.0}


def cost_rows(c: CostResult) -> list[str]:
    rows = []
    for kind in COST_KINDS:
        for regime, label in (("paced", "paced"), ("burst", "back-to-back")):
            st = c.stats.get(regime, {}).get(kind)
            if st is None:
                continue
            med, p99 = st
            target = COST_TARGETS.get(kind)
            # the targets are medians; judged on the paced regime, where every send wakes ZeroMQ
            ok = None if target is None else med <= target
            rows.append(
                f"| {COST_LABELS[kind]}, {label}, µs | {c.calls} | {med:.2f} | p99 {p99:.2f} "
                f"| {f'≤ {target:g} median' if target else '—'} | {verdict(ok)} | {NVRX.get(kind, '—')} |"
            )
    return rows


def detect_rows(d: DetectResult) -> list[str]:
    what = (
        f"heartbeat timeout {d.timeout:g} s"
        if d.kind == "heartbeat"
        else f"section `step` timeout {d.timeout:g} s"
    )
    rows = []
    for label, xs in (("daemon's `late_by`", d.late_by_ms), ("rank side", d.rank_side_ms)):
        top = max(xs) if xs else None
        ok = None if top is None else top <= 10.0
        rows.append(
            f"| detection excess, {what}, {label}, ms | {len(xs)} | {fmt(median(xs))} | max {fmt(top)} "
            f"| ≤ 10 max | {verdict(ok)} | {NVRX['detect']} |"
        )
    return rows


def cpu_percent(lo: LoadResult | None) -> float | None:
    if lo is None or lo.cpu_window_s is None or not lo.window_s:
        return None
    return 100 * lo.cpu_window_s / lo.window_s


def load_rows(lo: LoadResult, idle: LoadResult | None, s: Settings) -> list[str]:
    what = f"{s.load_ranks} ranks x {s.load_rate:g} heartbeats/s"
    pct, idle_pct = cpu_percent(lo), cpu_percent(idle)
    rate = s.load_ranks * s.load_rate  # messages per second
    per_msg = None if pct is None else pct / 100 / rate * 1e6
    net = None if pct is None or idle_pct is None else (pct - idle_pct) / 100 / rate * 1e6
    rss = [x for x in (lo.peak_hwm_kb, lo.reported_rss_kb) if x]
    rss_ok = None if not rss else max(rss) <= RSS_TARGET_KB
    received = "n/a" if lo.received is None else str(lo.received)
    dropped = "n/a" if lo.dropped is None else str(lo.dropped)
    expected = lo.sent + s.load_ranks  # each rank's hello too
    rows = [
        f"| daemon CPU, {what}, % of one core over {fmt(lo.window_s, 1)} s | 1 | {fmt(pct, 1)} "
        f"| {fmt(per_msg, 1)} µs per message | — | — | — |",
    ]
    if idle is not None:
        rows.append(
            f"| daemon CPU, the same ranks connected and silent (idle), % of one core over "
            f"{fmt(idle.window_s, 1)} s | 1 | {fmt(idle_pct, 1)} | {fmt(net, 1)} µs per message "
            "above idle | — | — | — |"
        )
    rows += [
        f"| daemon CPU, whole run (run_finished / sampled), s | 1 | {fmt(lo.reported_cpu_s)} "
        f"| {fmt(lo.cpu_total_s)} sampled | — | — | — |",
        f"| daemon peak RSS (run_finished / VmHWM), MiB | 1 | {fmt_kb(lo.reported_rss_kb)} "
        f"| {fmt_kb(lo.peak_hwm_kb)} VmHWM | ≤ 40 | {verdict(rss_ok)} | {NVRX['rss']} |",
        f"| messages received / dropped (`status` at the end) | 1 | {received} / {dropped} "
        f"| {expected} sent | 0 dropped | {verdict(None if lo.dropped is None else lo.dropped == 0)} | — |",
    ]
    return rows


def fmt_kb(kb: int | None) -> str:
    return "n/a" if kb is None else f"{kb / 1024:.1f}"


def restart_rows(rs: list[RestartResult]) -> list[str]:
    ok = [r for r in rs if r.deadline_to_steps_s is not None]
    xs = [r.deadline_to_steps_s for r in ok if r.deadline_to_steps_s is not None]
    ys = [r.daemon_deadline_to_steps_s for r in ok if r.daemon_deadline_to_steps_s is not None]
    return [
        f"| hang deadline → all ranks stepping again (2 ranks, gloo, standby), s "
        f"| {len(xs)}/{len(rs)} | {fmt(median(xs))} | max {fmt(max(xs) if xs else None)} | — | — | — |",
        f"| ... the same from the daemon's deadline (`t_wall - late_by`), s "
        f"| {len(ys)}/{len(rs)} | {fmt(median(ys))} | max {fmt(max(ys) if ys else None)} | — | — | — |",
    ]


def table(res: Results, s: Settings) -> str:
    rows = [
        "| measurement | n | median | p99 / max | target | met | nvidia-resiliency-ext 0.4.1 (quoted) |",
        "|---|---|---|---|---|---|---|",
    ]
    if res.cost is not None:
        rows += cost_rows(res.cost)
    for d in res.detect:
        rows += detect_rows(d)
    if res.load is not None:
        rows += load_rows(res.load, res.load_idle, s)
    if res.restart:
        rows += restart_rows(res.restart)
    return "\n".join(rows)


def cost_notes(c: CostResult) -> list[str]:
    out = []
    if c.problem:
        out.append(f"- cost: {c.problem} ({c.run_dir})")
    extra = []
    for regime, label in (("paced", "paced"), ("burst", "back-to-back")):
        st = c.stats.get(regime, {})
        if "unmonitored_section" in st and "timer" in st:
            extra.append(
                f"{label}: an unmonitored section open+close {st['unmonitored_section'][0]:.2f} µs, "
                f"the timer itself {st['timer'][0]:.2f} µs (medians)"
            )
    if extra:
        out.append("- cost: " + "; ".join(extra) + ".")
    if c.step_monitored is False:
        out.append("- cost: `step` was NOT monitored in the rank: the section figures are meaningless")
    for regime, counts in c.dropped.items():
        if any(counts.values()):
            out.append(
                f"- cost: {regime} sends dropped (queue full, those calls timed the drop): "
                + ", ".join(f"{k} {v}" for k, v in counts.items())
            )
    out += [f"- cost: the daemon dropped messages: {x}" for x in c.daemon_drops]
    return out


def detect_notes(d: DetectResult) -> list[str]:
    out = []
    if d.problem:
        out.append(f"- detect {d.kind}: {d.problem} ({d.run_dir})")
    if d.missing:
        out.append(f"- detect {d.kind}: generations hung but never declared so: {d.missing}")
    if d.wrong_kind:
        out.append(f"- detect {d.kind}: declared for another reason: {'; '.join(d.wrong_kind)}")
    out += [f"- detect {d.kind}: the daemon dropped messages: {x}" for x in d.daemon_drops]
    return out


def load_notes(lo: LoadResult, s: Settings, name: str = "load") -> list[str]:
    out = []
    if lo.problem:
        out.append(f"- {name}: {lo.problem} ({lo.run_dir})")
    out += [f"- {name}: {e}" for e in lo.status_errors]
    if lo.status_mid:
        out.append(
            f"- {name}: halfway, `status` said received {lo.status_mid.get('received')}, "
            f"dropped {lo.status_mid.get('dropped') or {}}"
        )
    if lo.received is not None and lo.received != lo.sent + s.load_ranks:
        out.append(
            f"- {name}: the daemon received {lo.received} messages, the ranks sent {lo.sent} "
            f"heartbeats + {s.load_ranks} hellos"
        )
    if lo.client_dropped:
        out.append(f"- {name}: the ranks' clients dropped {lo.client_dropped} sends (queue full)")
    if lo.schedule_late_max_s > 0.1:
        out.append(f"- {name}: a rank fell {lo.schedule_late_max_s:.2f} s behind its heartbeat schedule")
    if lo.rss_end_kb is not None:
        out.append(f"- {name}: daemon VmRSS at the end of the load {lo.rss_end_kb / 1024:.1f} MiB")
    out += [f"- {name}: the daemon dropped messages: {x}" for x in lo.daemon_drops]
    return out


def restart_notes(rs: list[RestartResult]) -> list[str]:
    out = []
    ok = [r for r in rs if r.deadline_to_steps_s is not None]
    if ok:
        parts = (
            ("deadline → rank_hung", "detect_s"),
            ("rank_hung → generation_ended (stacks, kill)", "hung_to_ended_s"),
            ("→ generation 1 started", "ended_to_started_s"),
            ("→ all ranks stepped", "started_to_steps_s"),
        )
        out.append(
            "- restart breakdown (medians): "
            + ", ".join(f"{label} {fmt(median(getattr(r, key) for r in ok), 3)} s" for label, key in parts)
        )
    for r in rs:
        if r.problem:
            out.append(f"- restart run {r.index}: {r.problem} ({r.run_dir})")
        if r.standby_lead_s is not None and r.standby_lead_s < 3.0:
            out.append(
                f"- restart run {r.index}: standby ranks spawned only {r.standby_lead_s:.1f} s before the "
                "hang: they may still have been importing torch (raise --restart-hang-step)"
            )
    others = [r.index for r in rs if r.hung_ranks and r.hung_ranks[0] != HANG_RANK]
    if others:
        out.append(
            f"- restart: in runs {others} the daemon declared another rank hung first: it stopped "
            f"heartbeating after the same step, blocked in the all-reduce rank {HANG_RANK} never joined "
            "(expected; the rank-side deadline is rank "
            f"{HANG_RANK}'s, the daemon's is the first declared)"
        )
    return out


def notes(res: Results, s: Settings) -> list[str]:
    out: list[str] = []
    runs: list[tuple[str, list[str]]] = []
    if res.cost is not None:
        out += cost_notes(res.cost)
        runs.append(("cost", res.cost.leftovers))
    for d in res.detect:
        out += detect_notes(d)
        runs.append((f"detect {d.kind}", d.leftovers))
    if res.load_idle is not None:
        out += load_notes(res.load_idle, s, "load (idle baseline)")
        runs.append(("load idle", res.load_idle.leftovers))
    if res.load is not None:
        out += load_notes(res.load, s)
        runs.append(("load", res.load.leftovers))
    out += restart_notes(res.restart)
    runs += [(f"restart run {r.index}", r.leftovers) for r in res.restart]
    out += [f"- {name}: processes left behind: {'; '.join(left)}" for name, left in runs if left]
    return out


def method(res: Results, s: Settings) -> str:
    said = []
    if res.cost is not None:
        said.append(
            "Cost: perf_counter_ns around each call in a rank under `ft-supervisor run --preload none`; "
            f"paced = a {s.gap_us:g} µs sleep before each call (kinds interleaved), back-to-back = a "
            f"tight loop of one kind, {s.burst} calls per block; the floor sends the same bytes to the "
            "same daemon socket from a raw DEALER; targets are medians."
        )
    if res.detect:
        said.append(
            f"Detection: one rank, a sign of life every {s.hang_interval * 1000:g} ms, then a hang, in "
            "each generation; late_by is the daemon's (rounded to 0.1 ms); rank side = `rank_hung` "
            "t_wall - (last send + timeout), which includes the message's delivery."
        )
    if res.load is not None:
        said.append(
            f"Load: {s.load_ranks} ranks, --preload none; CPU from /proc/<daemon>/stat over the window "
            "in which every rank was sending; idle = the same ranks connected but silent."
        )
    if res.restart:
        said.append(
            f"Restart: rank {HANG_RANK} hangs at step {s.restart_hang_step} of generation 0, heartbeat "
            f"timeout {s.restart_heartbeat_timeout:g} s, deadline = its last heartbeat + timeout."
        )
    said.append("nvidia-resiliency-ext figures are quoted from the issue, not measured.")
    return " ".join(said)


def report(res: Results, s: Settings) -> None:
    print(table(res, s))
    print()
    print(method(res, s))
    print(f"Artifacts: {s.out}")
    extra = notes(res, s)
    if extra:
        print()
        print("\n".join(extra))
    sys.stdout.flush()


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--quick", action="store_true", help="few repetitions everywhere: a smoke test")
    p.add_argument("--calls", type=int, default=None, help="timed calls of each kind (10000; quick 2000)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (500; quick 200)")
    p.add_argument("--gap-us", type=float, default=200.0, help="sleep before each paced call")
    p.add_argument(
        "--burst", type=int, default=1000, help="back-to-back calls per block (0.1 s pause between blocks)"
    )
    p.add_argument("--hangs", type=int, default=None, help="hangs per detection variant (13; quick 4)")
    p.add_argument("--hang-timeout", type=float, default=0.5, help="heartbeat / section timeout, s")
    p.add_argument("--hang-after", type=float, default=0.3, help="s of heartbeats before each hang")
    p.add_argument("--hang-interval", type=float, default=0.01, help="s between heartbeats")
    p.add_argument("--load-ranks", type=int, default=8)
    p.add_argument("--load-rate", type=float, default=100.0, help="heartbeats per second per rank")
    p.add_argument("--load-duration", type=float, default=None, help="s of load (30; quick 5)")
    p.add_argument(
        "--load-idle-duration",
        type=float,
        default=None,
        help="s of the idle baseline: the same ranks, connected, silent (10; quick 3; 0: skip it)",
    )
    p.add_argument("--restart-runs", type=int, default=None, help="runs (5; quick 1)")
    p.add_argument("--restart-hang-step", type=int, default=160, help="late enough for warm standbys")
    p.add_argument("--restart-steps-after", type=int, default=None, help="(20; quick 10)")
    p.add_argument("--restart-heartbeat-timeout", type=float, default=2.0)
    p.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every run's timeout")
    p.add_argument("--out", type=Path, default=None, help="artifact directory (default: a fresh tempdir)")
    p.add_argument(
        "--bin-dir",
        type=Path,
        default=Path(sys.executable).parent,  # not resolved: the venv's bin, not /usr/bin
        help="where ft-supervisor is (default: next to this python)",
    )
    a = p.parse_args(argv)
    parts = tuple(x.strip() for x in a.parts.split(",") if x.strip())
    unknown = [x for x in parts if x not in PARTS]
    if unknown or not parts:
        p.error(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    if not (a.bin_dir / "ft-supervisor").exists():
        p.error(f"{a.bin_dir / 'ft-supervisor'} not found: run with the project's .venv/bin/python")

    def pick(value: Any, full: Any, quick: Any) -> Any:
        return value if value is not None else quick if a.quick else full

    out = a.out or Path(tempfile.mkdtemp(prefix="ft-bench-hang-"))
    s = Settings(
        out=out.resolve(),
        bin_dir=a.bin_dir,
        parts=parts,
        calls=pick(a.calls, 10_000, 2_000),
        warmup=pick(a.warmup, 500, 200),
        gap_us=a.gap_us,
        burst=a.burst,
        hangs=pick(a.hangs, 13, 4),
        hang_timeout=a.hang_timeout,
        hang_after=a.hang_after,
        hang_interval=a.hang_interval,
        load_ranks=a.load_ranks,
        load_rate=a.load_rate,
        load_duration=pick(a.load_duration, 30.0, 5.0),
        load_idle_duration=pick(a.load_idle_duration, 10.0, 3.0),
        restart_runs=pick(a.restart_runs, 5, 1),
        restart_hang_step=a.restart_hang_step,
        restart_steps_after=pick(a.restart_steps_after, 20, 10),
        restart_heartbeat_timeout=a.restart_heartbeat_timeout,
        timeout_scale=a.timeout_scale,
    )
    if (
        s.calls < 1
        or s.burst < 1
        or s.hangs < 1
        or s.restart_runs < 1
        or s.load_ranks < 1
        or s.load_duration <= 0
    ):
        p.error("--calls, --burst, --hangs, --restart-runs, --load-ranks, --load-duration must be positive")
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        p.error(f"--out {out} is not empty: give a fresh directory")
    return s


def describe_cost(c: CostResult) -> str:
    st = c.stats.get("paced", {})
    hb = st.get("heartbeat", (None, None))[0]
    sec = st.get("section", (None, None))[0]
    return f"cost: heartbeat {fmt(hb)} µs, section {fmt(sec)} µs (paced medians) {c.problem or ''}"


def main(argv: list[str] | None = None, progress: Callable[[str], None] = lambda m: None) -> int:
    s = parse_args(argv)
    become_subreaper()
    install_stop_handlers()
    res = Results()
    code = 0
    try:
        if "cost" in s.parts:
            res.cost = measure_cost(s)
            progress(describe_cost(res.cost))
        if "detect" in s.parts:
            for kind in ("heartbeat", "section"):
                d = measure_detection(s, kind)
                res.detect.append(d)
                progress(
                    f"detect {kind}: late_by median {fmt(median(d.late_by_ms))} ms, "
                    f"max {fmt(max(d.late_by_ms) if d.late_by_ms else None)} ms {d.problem or ''}"
                )
        if "load" in s.parts:
            if s.load_idle_duration > 0:
                res.load_idle = measure_load(s, 0.0, s.load_idle_duration, "load-idle")
                progress(
                    f"load idle: cpu {fmt(res.load_idle.cpu_window_s)} s over "
                    f"{fmt(res.load_idle.window_s, 1)} s {res.load_idle.problem or ''}"
                )
            res.load = measure_load(s, s.load_rate, s.load_duration, "load")
            progress(
                f"load: cpu {fmt(res.load.cpu_window_s)} s over {fmt(res.load.window_s, 1)} s, "
                f"rss {fmt_kb(res.load.reported_rss_kb)} MiB {res.load.problem or ''}"
            )
        if "restart" in s.parts:
            # the first `import torch` after a while reads torch from disk: not in a timed run
            subprocess.run([sys.executable, "-c", "import torch"], check=False, timeout=120)
            for i in range(1, s.restart_runs + 1):
                r = measure_restart(s, i)
                res.restart.append(r)
                progress(
                    f"restart run {i}: deadline -> stepping {fmt(r.deadline_to_steps_s)} s (detect "
                    f"{fmt(r.detect_s, 3)}, stacks+kill {fmt(r.hung_to_ended_s, 3)}, start "
                    f"{fmt(r.ended_to_started_s, 3)}, first steps {fmt(r.started_to_steps_s, 3)}) "
                    f"{r.problem or ''}"
                )
    except (KeyboardInterrupt, Interrupted) as exc:
        progress(f"interrupted ({type(exc).__name__} {exc}): reporting what was measured")
        with signals_held():
            kill_leftovers(0.0)  # a safety net: whatever of ours still runs goes now
        code = 130
    with contextlib.suppress(OSError):
        (s.out / "results.json").write_text(json.dumps(asdict(res), indent=1, default=str))
    report(res, s)
    return code


if __name__ == "__main__":
    sys.exit(main(progress=lambda m: print(m, file=sys.stderr, flush=True)))
