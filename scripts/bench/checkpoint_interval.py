"""Checkpoint-interval benchmark: is the advised interval the right one, and does following it pay?

    .venv/bin/python scripts/bench/checkpoint_interval.py [--seeds 1,2,3] [--work 30]
        [--save-time 0.5] [--mtbf 8] [--fixed 1,3,10] [--out DIR]

One torch-free rank (``_interval_rank.py``) does ``--work`` seconds of 50 ms steps;
a save takes ``--save-time`` seconds; generation g fails after an exponential time
of mean ``--mtbf`` seconds (drawn from the seed and g, so every policy meets the
same failures), and ``ft-supervisor run`` restarts it from its last save. Policies:
a save every ``--fixed`` seconds; the advised interval
(``client.advised_checkpoint_interval()``, asked after every save, the shortest
fixed interval until the daemon advises: there is no advice before a save was
measured, so a first interval longer than the time to failure would never let one
be); the same with ``--mtbf`` given to the daemon as a prior.

Figures, per policy, means over the seeds: the wall time (the daemon's
``run_started`` to ``run_finished``), goodput (the work over the wall time),
failures, saves. Then, for every run, the daemon's last advice (its Ts, Tf, Tr and
Tc) beside the mean of the times to failure drawn for the generations that failed,
and the interval the formula gives on ``--save-time``, that mean and the Tr
measured. Last, the question's round trip inside the rank: after a save (the
advised runs) and back to back (a run of its own without failures).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    Interrupted,
    Launcher,
    become_subreaper,
    fmt,
    install_stop_handlers,
    median,
    percentile,
    read_jsonl,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from supervisor.core.checkpoint_interval import optimal_interval  # noqa: E402

FT = str(Path(sys.executable).parent / "ft-supervisor")
STEP_TIME = 0.05
BURST = 500


def one(
    out: Path, args: argparse.Namespace, seed: int, policy: str, *, prior: bool = False,
    mtbf: float | None = None, work: float | None = None, burst: int = 0,
) -> dict[str, Any] | None:  # fmt: skip
    out.mkdir(parents=True)
    mtbf = args.mtbf if mtbf is None else mtbf
    work = args.work if work is None else work
    argv = [FT, "run", "--nproc-per-node", "1", "--preload", "none", "--max-restarts", "1000",
            "--log-dir", str(out / "logs"), "--rdzv-id", "interval",
            "--ft-rank-section-timeouts", "checkpointing:none",
            "--ft-max-no-progress-cycles", "0",  # a rare saver fails again and again before saving
            *(["--mtbf", str(args.mtbf)] if prior else []),
            str(HERE / "_interval_rank.py"), str(out), str(work), str(STEP_TIME),
            str(args.save_time), str(mtbf), str(seed), policy, str(burst)]  # fmt: skip
    launcher = Launcher(argv, out)
    launcher.start()
    launcher.finish(time.monotonic() + 20 * work + 60)
    if launcher.run.exit_code != 0:
        print(f"run in {out} failed: exit {launcher.run.exit_code}", file=sys.stderr)
        return None
    events = read_jsonl(next((out / "logs" / "interval").glob("*/events.jsonl")))
    at = {e["event"]: e["t_wall"] for e in events if e["event"] in ("run_started", "run_finished")}
    wall = at["run_finished"] - at["run_started"]
    failed = [e["generation"] for e in events if e["event"] == "rank_exited" and e["state"] == "failed"]
    draws = [random.Random(f"{seed}-{g}").expovariate(1 / mtbf) for g in failed]
    advice = [e for e in events if e["event"] == "checkpoint_interval_advised"]

    def micros(name: str) -> list[float]:
        path = out / name
        return [float(x) for x in path.read_text().split()] if path.exists() else []

    return {
        "wall": wall,
        "goodput": work / wall,
        "failures": len(failed),
        "drawn": statistics.fmean(draws) if draws else None,
        "saves": sum(1 for e in events if e["event"] == "checkpoint_reported"),
        "advice": advice[-1] if advice else None,
        "asks": micros("asks"),
        "burst": micros("burst"),
    }


def _policies(args: argparse.Namespace, fixed: list[float]) -> list[tuple[str, str, bool]]:
    start = f"advised:{min(fixed):g}"
    return [*((f"every {x:g} s", f"{x:g}", False) for x in fixed),
            (f"advised ({min(fixed):g} s until advised)", start, False),
            (f"advised, --mtbf {args.mtbf:g} prior", start, True)]  # fmt: skip


def _tables(args: argparse.Namespace, seeds: list[int], policies: list[tuple[str, str, bool]],
            results: dict[str, list[tuple[int, dict[str, Any]]]]) -> None:  # fmt: skip
    print(f"work {args.work:g} s of {STEP_TIME * 1000:g} ms steps, a save {args.save_time:g} s, failures "
          f"every {args.mtbf:g} s on average (exponential), seeds {args.seeds}\n")  # fmt: skip
    print("| policy | wall s | goodput | failures | saves | runs ok |\n|---|---|---|---|---|---|")
    for name, _, _ in policies:
        rs = [r for _, r in results[name]]

        def mean(key: str, rs: list[dict[str, Any]] = rs) -> float | None:
            return statistics.fmean(r[key] for r in rs) if rs else None

        print(f"| {name} | {fmt(mean('wall'), 1)} | {fmt(mean('goodput'), 3)} | {fmt(mean('failures'), 1)} | "
              f"{fmt(mean('saves'), 1)} | {len(rs)}/{len(seeds)} |")  # fmt: skip
    print("\n| run (policy, seed) | advised: Ts s | Tf s | Tr s | Tc s | failures | drawn time to "
          "failure, mean s | Tc on the save time, the drawn mean and Tr s |\n"
          "|---|---|---|---|---|---|---|---|")  # fmt: skip
    for name, _, _ in policies:
        for seed, r in results[name]:
            a = r["advice"]
            if a is None:
                continue
            drawn = r["drawn"]
            true = None if drawn is None else optimal_interval(args.save_time, drawn, a["tr"] or 0.0)
            print(f"| {name}, {seed} | {fmt(a['ts'], 3)} | {fmt(a['tf'], 2)} | {fmt(a['tr'], 3)} | "
                  f"{fmt(a['seconds'], 2)} | {r['failures']} | {fmt(drawn, 2)} | "
                  f"{fmt(true, 2)} |")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--work", type=float, default=30.0)
    p.add_argument("--save-time", type=float, default=0.5)
    p.add_argument("--mtbf", type=float, default=8.0)
    p.add_argument("--fixed", default="1,3,10")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    become_subreaper()
    install_stop_handlers()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-interval-"))
    seeds = [int(s) for s in args.seeds.split(",")]
    policies = _policies(args, [float(x) for x in args.fixed.split(",")])
    results: dict[str, list[tuple[int, dict[str, Any]]]] = {name: [] for name, _, _ in policies}
    burst: dict[str, Any] | None = None
    try:
        burst = one(out / "burst", args, 0, "advised:1", mtbf=1e9, work=2.0, burst=BURST)
        for seed in seeds:  # interleaved: a busy moment of the machine hurts every policy alike
            for index, (name, policy, prior) in enumerate(policies):
                r = one(out / f"seed{seed}-{index}", args, seed, policy, prior=prior)
                if r is not None:
                    results[name].append((seed, r))
    except Interrupted as stop:
        print(f"interrupted ({stop}): the runs so far\n", file=sys.stderr)
    _tables(args, seeds, policies, results)
    after_saves = [x for name, _, _ in policies for _, r in results[name] for x in r["asks"]]
    back_to_back = [] if burst is None else burst["burst"]
    for what, values in (("after a save", after_saves), ("back to back", back_to_back)):
        if values:
            print(f"\nclient.advised_checkpoint_interval() round trip, {what}: median "
                  f"{fmt(median(values), 0)} µs, p99 {fmt(percentile(values, 99), 0)} µs, "
                  f"max {fmt(max(values), 0)} µs ({len(values)} questions)", end="")  # fmt: skip
    print()
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
