"""The goodput benchmark's tables (scripts/bench/goodput.py): goodput per launcher, and the
steps each generation redid after each fault (where the rank resumed from, and why).

Kept apart from goodput.py to keep that module under the project's 400 lines; the results
and settings are goodput.py's ``RunResult`` and ``Settings``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from _common import fmt, median

LABELS = {
    "ft": "ft-supervisor",
    "ft-snap": "ft-supervisor + memory snapshots",
    "torchrun": "torchrun",
    "torchrun-noshare": "torchrun (noshare)",
    "ft_launcher": "ft_launcher (NVRx)",
}


def by(results: Iterable[Any], name: str, faulted: bool) -> list[Any]:
    return [r for r in results if r.launcher == name and r.faulted == faulted]


def goodput_median(rs: list[Any]) -> float | None:
    return median(r.goodput for r in rs) if rs else None


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}x"


def disk_every(name: str, s: Any) -> str:
    if name.startswith("ft-snap"):
        return f"disk every {s.snap_save_every}, memory every step"
    return f"disk every {s.save_every}"


def table(results: list[Any], s: Any) -> str:
    faulted = {n: goodput_median(by(results, n, True)) for n in s.launchers}
    clean = {n: goodput_median(by(results, n, False)) for n in s.launchers}
    nvrx = faulted.get("ft_launcher")
    torchrun = faulted.get("torchrun") or faulted.get("torchrun-noshare")
    rows = [
        "| launcher | snapshots | run | finished | wall s | goodput | of its fault-free | vs ft_launcher "
        "| vs torchrun | downtime per fault s | steps redone per fault | restarts | launcher peak RSS MiB "
        "| tree peak PSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in s.launchers:
        for is_faulted in (True, False):
            rs = by(results, name, is_faulted)
            if not rs:
                continue
            g = faulted[name] if is_faulted else clean[name]
            downs = [median(r.downtimes[i] for r in rs if i < len(r.downtimes)) for i in range(s.fault_count)]
            redone = [median(r.redone[i] for r in rs if i < len(r.redone)) for i in range(s.fault_count)]
            rows.append(
                f"| {LABELS[name]} | {disk_every(name, s)} | {'faults' if is_faulted else 'fault-free'} "
                f"| {sum(r.ok for r in rs)}/{len(rs)} | {fmt(median(r.wall_s for r in rs if r.ok), 1)} "
                f"| {fmt(g, 3)} | {ratio(g, clean[name]) if is_faulted else '1.00x'} "
                f"| {ratio(g, nvrx) if is_faulted and name != 'ft_launcher' else ''} "
                f"| {ratio(g, torchrun) if is_faulted and not name.startswith('torchrun') else ''} "
                f"| {' / '.join(fmt(x) for x in downs) if is_faulted else ''} "
                f"| {' / '.join(fmt(x, 0) for x in redone) if is_faulted else ''} "
                f"| {fmt(median(r.restarts for r in rs), 0)} "
                f"| {fmt(median(r.launcher_hwm_kb / 1024 for r in rs if r.launcher_hwm_kb), 1)} "
                f"| {fmt(median(r.tree_pss_kb / 1024 for r in rs if r.tree_pss_kb), 0)} |"
            )
    return "\n".join(rows)


def redone_table(results: list[Any], s: Any) -> str:
    """Per launcher and fault: the step it fired at, and in each run the step the next
    generation resumed from, from where (memory / disk / none), and the steps redone."""
    faults = [f.strip() for f in s.faults.split(",") if f.strip()]
    rows = ["| launcher | fault | at step | resumed from, each run | steps redone, each run | most |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for name in s.launchers:
        rs = by(results, name, True)
        for i, spec in enumerate(faults):
            at, _, kind = spec.partition(":")
            resumed = [f"{r.resumed[i][0]} ({r.resumed[i][1]})" if i < len(r.resumed) and r.resumed[i]
                       else "-" for r in rs]  # fmt: skip
            redone = [r.redone[i] if i < len(r.redone) else None for r in rs]
            known = [x for x in redone if x is not None]
            rows.append(f"| {LABELS[name]} | {kind} | {at} | {', '.join(resumed)} "
                        f"| {', '.join('-' if x is None else str(x) for x in redone)} "
                        f"| {max(known) if known else '-'} |")  # fmt: skip
    return "\n".join(rows)


def report(results: list[Any], s: Any) -> None:
    print(table(results, s))
    print()
    print(redone_table(results, s))
    print()
    print(
        f"{s.nproc} ranks, {s.steps} steps x {s.step_time * 1000:.0f} ms ({s.work_s:.0f} s of work); "
        f"faults on rank 1: {s.faults}. Heartbeat timeout {s.hb_timeout:g} s "
        f"(ft-supervisor, ft_launcher), collective timeout {s.pg_timeout:g} s (all), max restarts "
        f"{s.fault_count + 1}. Medians of {s.runs} run(s); goodput = work / wall (0 for a run that did not "
        f"finish). Downtime: the fault -> every rank stepping again, per fault in schedule order. "
        f"Steps redone: the step the fault fired at (steps done) less the step the next generation "
        f"resumed from.\nArtifacts: {s.out}"
    )
    notes = [f"- {LABELS[r.launcher]} ({'faults' if r.faulted else 'fault-free'}) run {r.index} did not "
             f"finish: {r.failure}" for r in results if not r.ok]  # fmt: skip
    notes += [f"- {LABELS[r.launcher]} run {r.index} left processes behind: {'; '.join(r.leftovers)}"
              for r in results if r.leftovers and not r.timed_out]  # fmt: skip
    notes += [f"- {LABELS[r.launcher]} run {r.index}: {m}" for r in results for m in r.mixed]
    if notes:
        print()
        print("\n".join(notes))
    sys.stdout.flush()
