"""Decision benchmark: after a failure, does the daemon blame the right rank and do the right thing?

How to run (from the repository root, in the project's virtualenv)::

    .venv/bin/python scripts/bench/decisions.py                  # 7 scenarios x 5 runs, ~15-20 minutes
    .venv/bin/python scripts/bench/decisions.py --runs 3 --scenarios hang-r1-section,kill-kill
    .venv/bin/python scripts/bench/decisions.py --json           # the results as JSON on stdout
    PYTHONPATH=/tmp/ft-head .venv/bin/python scripts/bench/decisions.py   # another supervisor tree

Every run starts ``python -m supervisor run --nproc-per-node 2 --max-restarts 3`` on
``scripts/bench/_decision_rank.py`` (2 ranks, DDP over gloo on CPU, 50 ms steps,
each in a ``step`` section, a heartbeat and an iteration report per step, a
checkpoint every 10 steps that the next generation resumes from) with faults
injected by generation and step. The scenarios (``--step-timeout`` T, 3 s):

* ``hang-r1-section``, ``hang-r0-section``: that rank sleeps forever inside its
  ``step`` section, before the backward; it opened the section 0.2 s after its
  peer, so the peer's deadline (the peer waits in DDP's all-reduce) fires first;
* ``hang-both-section``: both ranks do so;
* ``hang-r1-out``: rank 1 sleeps forever out of any section (after a step, "in
  data loading"); rank 0 opens its next step and waits in the all-reduce; the
  out-of-section timeout is 2T, so rank 0's step deadline fires first;
* ``crash-then-hang``: rank 1 raises in generation 0, rank 0 hangs in its section
  in generation 1 (``--ft-learn-timeouts false``: generation 1's hang must meet
  the configured timeouts, not ones learned from generation 0);
* ``crash-slow-exit``: rank 1 raises in generation 0 and then takes 2T to exit
  (after its error file and the client's report); rank 0 waits in the
  all-reduce, its step open, past its deadline: it waits on a peer that already
  failed, and declaring it hung is a false hang;
* ``kill-kill``: rank 1 SIGKILLs itself at step 20 of generation 0, and again at
  step 45 of generation 1, after 25 steps and two checkpoints of progress: a new
  incident, so restart both times.

Every scenario expects a restart after each failed generation and then a
generation that trains to the end (exit 0). Runs are interleaved (one of each
scenario, then the next round) so that a busy moment of the machine hurts all
alike; each run gets a fresh log directory, run id and checkpoint.

Scores, per run, from its ``events.jsonl`` and ``reason.json``:

* right rank: in every generation that hung, the set of ranks named by
  ``rank_hung`` events is the set of ranks that hung; in a generation that
  crashed, the ``decision``'s rank is the crashed rank;
* right action: the ``decision`` events' actions are the expected ones, in
  order, and the run exits with the expected code (a timed-out run is wrong);
* false hangs: ``rank_hung`` events naming a rank that was not hung (a rank
  waiting for a hung peer), or in a generation that failed by a crash or a kill;
* failure -> decision: the rank's own ``fault`` milestone (``time.time()``, the
  moment the fault began) to the ``decision`` event; for a hang it includes the
  timeout. Below the table, deadline -> decision (the first ``rank_hung``'s
  ``t_wall - late_by``): what deciding costs once a deadline was missed.

``rank_hung``'s optional ``blamed_by``, ``deadline_rank`` and ``waiting`` fields
are read when present and tallied below the table.

Hygiene (as hang.py): the daemon runs in its own session with a wall-clock
timeout (``--run-timeout``), after which its process group gets SIGTERM, then
SIGKILL; this script is a child subreaper, so whatever a run leaves behind is
reparented here, reported and SIGKILLed. Ctrl-C or SIGTERM stops the current
run the same way and prints what was measured so far. Artifacts stay in
``--out`` (default: a fresh temporary directory).

Linux only. Standard library only (the ranks use torch from the venv).
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
from collections import Counter
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
    read_jsonl,
    signals_held,
)

HERE = Path(__file__).resolve().parent
RANK_SCRIPT = HERE / "_decision_rank.py"
MAX_RESTARTS = 3
HANG, CRASH = "hang", "crash"


@dataclass(frozen=True, slots=True)
class Expect:
    """One generation that fails, and what should follow it."""

    generation: int
    kind: str  # hang | crash
    ranks: frozenset[int]  # the ranks that hung, or the rank that crashed
    action: str


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    faults: tuple[str, ...]  # _decision_rank.py --fault specs
    expect: tuple[Expect, ...]
    steps: int = 40
    out_of_section: bool = False  # configure --ft-rank-out-of-section-timeout
    learn: bool = True
    learn_off_why: str = ""
    exit_code: int = 0

    @property
    def stacks_tell(self) -> bool:
        """A hang among synchronous ranks: the stacks tell the hung rank from its waiting peer."""
        return any(e.kind == HANG for e in self.expect)


def _hang(gen: int, *ranks: int) -> Expect:
    return Expect(gen, HANG, frozenset(ranks), "restart")


def _crash(gen: int, rank: int) -> Expect:
    return Expect(gen, CRASH, frozenset({rank}), "restart")


SCENARIOS = (
    Scenario("hang-r1-section", ("hang-section:1:0:20",), (_hang(0, 1),)),
    Scenario("hang-r0-section", ("hang-section:0:0:20",), (_hang(0, 0),)),
    Scenario("hang-both-section", ("hang-section:0:0:20", "hang-section:1:0:20"), (_hang(0, 0, 1),)),
    Scenario("hang-r1-out", ("hang-out:1:0:20",), (_hang(0, 1),), out_of_section=True),
    Scenario(
        "crash-then-hang",
        ("raise:1:0:20", "hang-section:0:1:35"),
        (_crash(0, 1), _hang(1, 0)),
        steps=50,
        learn=False,
        learn_off_why="generation 1's hang must meet the configured timeouts, not ones learned in 0",
    ),
    Scenario("crash-slow-exit", ("raise-slow:1:0:20",), (_crash(0, 1),)),
    Scenario("kill-kill", ("kill:1:0:20", "kill:1:1:45"), (_crash(0, 1), _crash(1, 1)), steps=60),
)
BY_NAME = {s.name: s for s in SCENARIOS}


@dataclass(frozen=True, slots=True)
class Settings:
    out: Path
    scenarios: tuple[Scenario, ...]
    runs: int
    step_timeout: float
    run_timeout: float
    json: bool


# -- one run ------------------------------------------------------------------------------------


@dataclass(slots=True)
class RunResult:
    scenario: str
    index: int
    run_dir: str
    exit_code: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    hung: dict[int, list[int]] = field(default_factory=dict)  # generation -> ranks named by rank_hung
    hung_events: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    reason: dict[str, Any] = field(default_factory=dict)
    right_rank: bool = False
    right_action: bool = False
    false_hangs: int = 0
    failure_to_decision_s: list[float] = field(default_factory=list)
    deadline_to_decision_s: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)


def daemon_argv(s: Settings, sc: Scenario, run_dir: Path) -> list[str]:
    t = s.step_timeout
    options = [
        "--nproc-per-node", "2", "--max-restarts", str(MAX_RESTARTS),
        "--log-dir", str(run_dir / "logs"), "--rdzv-id", f"bench-decisions-{uuid.uuid4().hex[:8]}",
        "--ft-rank-section-timeouts", f"step:{t:g}",
    ]  # fmt: skip
    if sc.out_of_section:
        options += ["--ft-rank-out-of-section-timeout", f"{2 * t:g}"]
    if not sc.learn:
        options += ["--ft-learn-timeouts", "false"]
    program = [
        str(RANK_SCRIPT), "--steps", str(sc.steps), "--checkpoint", str(run_dir / "checkpoint.pt"),
        "--events", str(run_dir / "milestones.jsonl"), "--linger", f"{2 * t:g}",
    ]  # fmt: skip
    for fault in sc.faults:
        program += ["--fault", fault]
    return [sys.executable, "-m", "supervisor", "run", *options, *program]


def launch(argv: list[str], run_dir: Path, timeout: float) -> LauncherRun:
    launcher = Launcher(argv, run_dir, sample_interval=0.25)
    launcher.start()
    try:
        launcher.finish(time.monotonic() + timeout)  # stops it (and all it left) after the timeout
    except BaseException:
        launcher.abort()  # interrupted: stop it and all it left now
        raise
    return launcher.run


def run_once(s: Settings, sc: Scenario, index: int) -> RunResult:
    run_dir = s.out / f"{sc.name}-{index}"
    run_dir.mkdir(parents=True)
    run = launch(daemon_argv(s, sc, run_dir), run_dir, s.run_timeout)
    r = RunResult(sc.name, index, str(run_dir), run.exit_code, run.timed_out, run.wall_s)
    r.leftovers = run.leftovers
    log = ft_event_log(run_dir / "logs")
    events = read_jsonl(log) if log is not None else []
    if log is not None and (log.parent / "reason.json").exists():
        with contextlib.suppress(OSError, ValueError):
            r.reason = json.loads((log.parent / "reason.json").read_text())
    score(r, sc, events, read_jsonl(run_dir / "milestones.jsonl"))
    if run.timed_out:
        r.problems.append(f"timed out after {run.wall_s:.0f} s")
    if run.exit_code == 1:
        r.problems.append("exit 1: the daemon's own internal error (see launcher.out)")
    if not events:
        r.problems.append("no events.jsonl")
    return r


HUNG_FIELDS = (
    "generation", "rank", "kind", "section", "late_by", "blamed_by", "deadline_rank", "waiting", "evidence",
)  # fmt: skip
DECISION_FIELDS = ("generation", "action", "reason", "rule", "rank", "detail")


def score(r: RunResult, sc: Scenario, events: list[dict[str, Any]], marks: list[dict[str, Any]]) -> None:
    hung = [e for e in events if e.get("event") == "rank_hung"]
    decisions = [e for e in events if e.get("event") == "decision"]
    r.hung_events = [{k: e.get(k) for k in HUNG_FIELDS if k in e} for e in hung]
    r.decisions = [{k: e.get(k) for k in DECISION_FIELDS} for e in decisions]
    for e in hung:
        r.hung.setdefault(e["generation"], []).append(e["rank"])
    expect = {x.generation: x for x in sc.expect}
    # right rank: every failed generation's blame
    r.right_rank = True
    for x in sc.expect:
        if x.kind == HANG:
            ok = set(r.hung.get(x.generation, ())) == x.ranks
        else:
            d = next((d for d in decisions if d["generation"] == x.generation), None)
            ok = d is not None and d.get("rank") in x.ranks
        r.right_rank = r.right_rank and ok
    # right action: the decisions in order, then the exit code
    got = [(d["generation"], d["action"]) for d in decisions]
    wanted = [(x.generation, x.action) for x in sc.expect]
    r.right_action = got == wanted and r.exit_code == sc.exit_code and not r.timed_out
    # false hangs: a rank named that was not hung, or a hang named in a crashed generation
    for e in hung:
        fault = expect.get(e["generation"])
        if fault is None or fault.kind != HANG or e["rank"] not in fault.ranks:
            r.false_hangs += 1
    # timings, per decided generation
    for d in decisions:
        faults = [m["t"] for m in marks if m.get("event") == "fault" and m["generation"] == d["generation"]]
        if faults:
            r.failure_to_decision_s.append(d["t_wall"] - min(faults))
        first = next((e for e in hung if e["generation"] == d["generation"]), None)
        if first is not None:
            r.deadline_to_decision_s.append(d["t_wall"] - (first["t_wall"] - first.get("late_by", 0.0)))


def describe(r: RunResult) -> str:
    hung = " ".join(f"g{g}:{sorted(v)}" for g, v in sorted(r.hung.items())) or "-"
    acts = ",".join(f"{d['action']}({d['reason']}, rank {d['rank']})" for d in r.decisions) or "-"
    verdict = f"rank {'ok' if r.right_rank else 'WRONG'}, action {'ok' if r.right_action else 'WRONG'}"
    extra = f" [{'; '.join(r.problems)}]" if r.problems else ""
    return (
        f"{r.scenario} #{r.index}: exit {r.exit_code}, rank_hung {hung}, decisions {acts}; {verdict}, "
        f"false hangs {r.false_hangs}, {r.wall_s:.0f} s{extra}"
    )


# -- the table ------------------------------------------------------------------------------------


def pct(n: int, of: int) -> str:
    return "n/a" if of == 0 else f"{n}/{of} ({100 * n / of:.0f} %)"


def row(name: str, rs: list[RunResult]) -> str:
    times = [t for r in rs for t in r.failure_to_decision_s]
    return (
        f"| {name} | {len(rs)} | {pct(sum(r.right_rank for r in rs), len(rs))} "
        f"| {pct(sum(r.right_action for r in rs), len(rs))} | {sum(r.false_hangs for r in rs)} "
        f"| {fmt(median(times))} |"
    )


def table(s: Settings, results: list[RunResult]) -> str:
    lines = [
        "| scenario | runs | right rank | right action | false hangs | median failure->decision s |",
        "|---|---|---|---|---|---|",
    ]
    for sc in s.scenarios:
        rs = [r for r in results if r.scenario == sc.name]
        lines.append(row(f"{sc.name}{' †' if sc.stacks_tell else ''}", rs))
    lines.append(row("**total**", results))
    told = {sc.name for sc in s.scenarios if sc.stacks_tell}
    lines.append(row("where the stacks tell (†)", [r for r in results if r.scenario in told]))
    return "\n".join(lines)


def targets(s: Settings, results: list[RunResult]) -> str:
    told = [r for r in results if r.scenario in {sc.name for sc in s.scenarios if sc.stacks_tell}]
    right = sum(r.right_rank for r in told)
    false = sum(r.false_hangs for r in results)
    rank_ok = "n/a" if not told else "met" if right == len(told) else "**missed**"
    return (
        f"Targets: 100 % right rank where the stacks tell (†): {pct(right, len(told))}, "
        f"{rank_ok}; 0 false hang declarations: {false}, "
        f"{'n/a' if not results else 'met' if false == 0 else '**missed**'}."
    )


def method(s: Settings) -> str:
    t = s.step_timeout
    off = [f"`{sc.name}` ({sc.learn_off_why})" for sc in s.scenarios if not sc.learn]
    return (
        f"Method: 2 ranks, DDP over gloo on CPU, 50 ms steps, `--max-restarts {MAX_RESTARTS}`, "
        f"`--ft-rank-section-timeouts step:{t:g}` (out-of-section {2 * t:g} s in `hang-r1-out`; "
        f"rank 1 takes {2 * t:g} s to exit after raising in `crash-slow-exit`); "
        f"each scenario expects a restart per failed generation, then exit 0. "
        f"`--ft-learn-timeouts false` in {', '.join(off) or 'none'}; learning is on elsewhere. "
        "failure->decision: from the rank's fault to the `decision` event (a hang's includes its "
        f"timeout, {t:g} s from the peer's step opening)."
    )


def tally(values: list[Any]) -> str:
    return ", ".join(f"{k}: {n}" for k, n in Counter(values).most_common()) or "-"


def notes(s: Settings, results: list[RunResult]) -> list[str]:
    out = []
    for sc in s.scenarios:
        rs = [r for r in results if r.scenario == sc.name]
        if not rs:
            continue
        hung = [" ".join(f"g{g}:{sorted(v)}" for g, v in sorted(r.hung.items())) or "none" for r in rs]
        acts = [
            ", ".join(f"{d['action']} ({d['reason']}, rank {d['rank']})" for d in r.decisions) + f" -> exit "
            f"{r.exit_code}"
            for r in rs
        ]
        line = f"- {sc.name}: rank_hung {tally(hung)}; decisions {tally(acts)}"
        by = [e.get("blamed_by") for r in rs for e in r.hung_events if "blamed_by" in e]
        if by:
            line += f"; blamed_by {tally(by)}"
        gaps = [t for r in rs for t in r.deadline_to_decision_s]
        if gaps:
            line += f"; deadline->decision median {fmt(median(gaps))} s"
        out.append(line)
    for r in results:
        out += [f"- {r.scenario} #{r.index}: {p} ({r.run_dir})" for p in r.problems]
        if r.leftovers:
            out.append(f"- {r.scenario} #{r.index}: processes left behind: {'; '.join(r.leftovers)}")
    return out


def supervisor_source() -> str:
    """Where the daemon's ``supervisor`` package comes from (PYTHONPATH may point elsewhere)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import supervisor; print(supervisor.__file__)"],
            capture_output=True, text=True, timeout=60, check=False, cwd=tempfile.gettempdir(),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "unknown (timed out)"
    return str(Path(done.stdout.strip()).parent) if done.returncode == 0 else "unknown"


def report(s: Settings, results: list[RunResult], source: str, wall_s: float) -> None:
    if s.json:
        data = {
            "supervisor": source,
            "wall_s": round(wall_s, 1),
            "settings": {"runs": s.runs, "step_timeout": s.step_timeout, "run_timeout": s.run_timeout},
            "scenarios": [
                {**asdict(sc), "stacks_tell": sc.stacks_tell, "expect": [
                    {**asdict(x), "ranks": sorted(x.ranks)} for x in sc.expect
                ]} for sc in s.scenarios
            ],
            "runs": [asdict(r) for r in results],
            "artifacts": str(s.out),
        }  # fmt: skip
        print(json.dumps(data, indent=1, default=str))
        return
    print(table(s, results))
    print()
    print(targets(s, results))
    print()
    print(method(s))
    print(f"Daemon: `supervisor` from {source}. Wall time {wall_s / 60:.1f} min. Artifacts: {s.out}")
    extra = notes(s, results)
    if extra:
        print()
        print("\n".join(extra))
    sys.stdout.flush()


# -- main -------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="runs of each scenario (interleaved)")
    p.add_argument(
        "--scenarios", default=",".join(BY_NAME), help=f"comma-separated subset of {','.join(BY_NAME)}"
    )
    p.add_argument("--step-timeout", type=float, default=3.0, help="the step section's timeout, s")
    p.add_argument("--run-timeout", type=float, default=180.0, help="wall-clock limit of one run, s")
    p.add_argument("--out", type=Path, default=None, help="artifact directory (default: a fresh tempdir)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    a = p.parse_args(argv)
    names = [x.strip() for x in a.scenarios.split(",") if x.strip()]
    unknown = [x for x in names if x not in BY_NAME]
    if unknown or not names:
        p.error(f"--scenarios: unknown {unknown}; choose from {', '.join(BY_NAME)}")
    if a.runs < 1 or a.step_timeout <= 0 or a.run_timeout <= 0:
        p.error("--runs, --step-timeout and --run-timeout must be positive")
    out = (a.out or Path(tempfile.mkdtemp(prefix="ft-bench-decisions-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        p.error(f"--out {out} is not empty: give a fresh directory")
    return Settings(out, tuple(BY_NAME[x] for x in names), a.runs, a.step_timeout, a.run_timeout, a.json)


def main(argv: list[str] | None = None) -> int:
    s = parse_args(argv)
    become_subreaper()
    install_stop_handlers()
    source = supervisor_source()
    started = time.monotonic()
    results: list[RunResult] = []
    code = 0
    total = s.runs * len(s.scenarios)
    try:
        for i in range(1, s.runs + 1):
            for sc in s.scenarios:  # interleaved: one of each, then the next round
                r = run_once(s, sc, i)
                results.append(r)
                print(f"[{len(results)}/{total}] {describe(r)}", file=sys.stderr, flush=True)
    except (KeyboardInterrupt, Interrupted) as exc:
        print(f"interrupted ({type(exc).__name__} {exc}): reporting what was measured", file=sys.stderr)
        with signals_held():
            kill_leftovers(0.0)  # a safety net: whatever of ours still runs goes now
        code = 130
    with contextlib.suppress(OSError):
        (s.out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1, default=str))
    report(s, results, source, time.monotonic() - started)
    return code


if __name__ == "__main__":
    sys.exit(main())
