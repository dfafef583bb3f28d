"""Where a restart's time goes: the restart benchmark's runs, phase by phase.

    .venv/bin/python scripts/bench/restart_phases.py /tmp/bench          # the --out of restart.py

For each ft-supervisor run in the directory (``<variant>-<n>/``), the seconds from rank 1's
``crash`` milestone to each mark of the restart: the daemon's events (wall clock
``t_wall``: when the daemon handled them) and the ranks' own milestones from
``scripts/train.py --events`` (wall clock, written by the rank itself); the latest rank's
where both ranks have one. Prints one table per variant, the median of its runs and the
range, and the step between two consecutive marks (what each phase adds). torchrun runs
have no daemon events and are skipped. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Events = list[dict[str, Any]]
Find = Callable[[Events, Events], "float | None"]  # (the daemon's events, the ranks' milestones)


def _daemon(
    events: Events, name: str, pick: Callable[[list[float]], float] = min, **where: Any
) -> float | None:
    times = [
        e["t_wall"] for e in events if e["event"] == name and all(e.get(k) == v for k, v in where.items())
    ]
    return pick(times) if times else None


def _ranks(marks: Events, name: str) -> float | None:
    """The latest rank's milestone ``name`` in generation 1 (every rank has got there)."""
    times = [m["t"] for m in marks if m["event"] == name and m["generation"] == 1]
    return max(times) if times else None


PHASES: list[tuple[str, Find]] = [
    ("the failing rank's exception reported", lambda d, r: _daemon(d, "exception_reported", generation=0)),
    ("its exit seen (rank_exited)", lambda d, r: _daemon(d, "rank_exited", generation=0, rank=1)),
    ("every rank of generation 0 exited", lambda d, r: _daemon(d, "rank_exited", max, generation=0)),
    ("decision", lambda d, r: _daemon(d, "decision", generation=0)),
    ("go (generation 1 started)", lambda d, r: _daemon(d, "generation_started", generation=1)),
    ("process group made (started)", lambda d, r: _ranks(r, "started")),
    ("model built, disk snapshot loaded (loaded)", lambda d, r: _ranks(r, "loaded")),
    ("ballast allocated (allocated)", lambda d, r: _ranks(r, "allocated")),
    ("restore() returned (restored)", lambda d, r: _ranks(r, "restored")),
    ("first step computed (stepped)", lambda d, r: _ranks(r, "stepped")),
    ("its snapshot taken: every rank stepping (first_step)", lambda d, r: _ranks(r, "first_step")),
]


def load(path: Path) -> Events:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def phases(run: Path) -> dict[str, float | None] | None:
    """Seconds since the crash of each phase's mark in one run; None when it has no crash or no events."""
    daemon = sorted(run.glob("logs/*/*/events.jsonl"))
    marks_file = run / "events.jsonl"
    if not daemon or not marks_file.exists():
        return None
    marks, events = load(marks_file), load(daemon[0])
    crash = next((m["t"] for m in marks if m["event"] == "crash" and m["generation"] == 0), None)
    if crash is None:
        return None
    out: dict[str, float | None] = {}
    for label, find in PHASES:
        t = find(events, marks)
        out[label] = None if t is None else t - crash
    return out


def table(variant: str, runs: list[dict[str, float | None]]) -> list[str]:
    lines = [f"{variant}: {len(runs)} runs, seconds since the crash, median (min-max); + the phase's own",
             "| mark | since the crash | phase |", "|---|---|---|"]  # fmt: skip
    before: float | None = 0.0
    for label, _ in PHASES:
        values = [r[label] for r in runs if r.get(label) is not None]
        if not values:
            continue
        mid = statistics.median(values)
        step = "" if before is None else f"+{mid - before:.2f}"
        lines.append(f"| {label} | {mid:.2f} ({min(values):.2f}-{max(values):.2f}) | {step} |")
        before = mid
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="restart.py's --out directory")
    a = p.parse_args(argv)
    by_variant: dict[str, list[dict[str, float | None]]] = {}
    for run in sorted(a.out.iterdir()):
        variant, _, n = run.name.rpartition("-")
        got = phases(run) if run.is_dir() and n.isdigit() else None
        if got is not None:
            by_variant.setdefault(variant, []).append(got)
    if not by_variant:
        print(f"no ft-supervisor run with a crash in {a.out}", file=sys.stderr)
        return 1
    for variant, runs in by_variant.items():
        print("\n".join(table(variant, runs)), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
