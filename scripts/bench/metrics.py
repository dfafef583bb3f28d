"""What the Prometheus endpoint (``--metrics-port``) costs the daemon.

How to run (from the repository root, in the project's virtualenv, with the
``metrics`` extra installed)::

    .venv/bin/python scripts/bench/metrics.py                    # 5 runs per variant, ~3 minutes
    .venv/bin/python scripts/bench/metrics.py --runs 3 --workload light

Method: the demo's run (``scripts/demo.sh``: 2 ranks of ``scripts/train.py``, DDP
over gloo on CPU, 50 ms steps, rank 1 raises at step 70 of generation 0, one
restart from warm standbys, 120 steps) under ``ft-supervisor run``, in three
variants, interleaved run by run so that a busy moment hurts them alike:

* ``off``: no ``--metrics-port`` (prometheus-client is not even imported);
* ``on``: ``--metrics-port 0``, never scraped;
* ``on, scraped 1/s``: the same, and this script GETs ``/metrics`` every second,
  15-60 times as often as a Prometheus server usually would.

Figures come from the daemon's own ``run_finished`` event: ``daemon_max_rss_kb``
(its peak RSS) and ``daemon_cpu_s`` (user + system CPU of the daemon process, all
its threads, the HTTP server's included); medians over ``--runs``. ``--workload
light`` uses torch-free ranks that heartbeat and report every 10 ms step
(``tests/fixtures/ranks/faulty.py``, rank 1 SIGKILLed 3 s in): more messages,
rank_stepping events, a recovery observed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    Interrupted,
    Launcher,
    become_subreaper,
    fmt,
    ft_event_log,
    install_stop_handlers,
    median,
    read_jsonl,
)

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ("off", "on", "scraped")
LABELS = {"off": "off", "on": "on", "scraped": "on, scraped 1/s"}


@dataclass(slots=True)
class Result:
    variant: str
    exit_code: int | None
    rss_kb: int | None = None
    cpu_s: float | None = None
    seconds: float | None = None
    restarts: int | None = None
    scrape_ms: list[float] = field(default_factory=list)
    scrape_bytes: int | None = None


def workload(kind: str, run_dir: Path) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if kind == "demo":
        program = [str(REPO / "scripts" / "train.py"), "--steps", "120", "--crash-at-step", "70",
                   "--snapshot", str(run_dir / "snapshot.pt")]  # fmt: skip
        return program, env
    env["FT_SIM_FAULT_DESC"] = "rank_killed;1;3;0"
    program = [str(REPO / "tests" / "fixtures" / "ranks" / "faulty.py"), "--seconds", "10",
               "--later-seconds", "3"]  # fmt: skip
    return program, env


def argv(variant: str, kind: str, run_dir: Path, program: list[str]) -> list[str]:
    out = [sys.executable, "-m", "supervisor", "run", "--nproc-per-node", "2", "--max-restarts", "3",
           "--log-dir", str(run_dir / "logs"), "--rdzv-id", "bench"]  # fmt: skip
    if kind == "light":
        out += ["--preload", "none"]
    if variant != "off":
        out += ["--metrics-port", "0"]
    return [*out, *program]


def scrape(port: int, r: Result) -> None:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read()
    except OSError:
        return  # the run is ending
    r.scrape_ms.append((time.perf_counter() - t0) * 1000)
    r.scrape_bytes = len(body)


def run_once(variant: str, kind: str, out: Path, index: int, timeout: float) -> Result:
    run_dir = out / f"{variant}-{index}"
    run_dir.mkdir(parents=True)
    program, env = workload(kind, run_dir)
    launcher = Launcher(argv(variant, kind, run_dir, program), run_dir, env=env)
    launcher.start()
    r = Result(variant, None)
    deadline = time.monotonic() + timeout
    port: int | None = None
    try:
        while not launcher.poll(1.0, deadline) and time.monotonic() < deadline:
            if variant != "scraped":
                continue
            if port is None:
                log = ft_event_log(run_dir / "logs")
                serving = [e for e in read_jsonl(log) if e["event"] == "metrics_serving"] if log else []
                port = serving[0]["port"] if serving else None
            if port is not None:
                scrape(port, r)
    except Interrupted:
        launcher.abort()
        raise
    launcher.finish(deadline)
    r.exit_code = launcher.run.exit_code
    log = ft_event_log(run_dir / "logs")
    finished = [e for e in read_jsonl(log) if e["event"] == "run_finished"] if log else []
    if finished:
        e = finished[-1]
        r.rss_kb, r.cpu_s = e["daemon_max_rss_kb"], e["daemon_cpu_s"]
        r.seconds, r.restarts = e["seconds"], e["restarts_used"]
    return r


def table(results: list[Result]) -> str:
    base = [r for r in results if r.variant == "off" and r.exit_code == 0]
    rss0, cpu0 = median(r.rss_kb for r in base), median(r.cpu_s for r in base)
    rows = [
        "| metrics | runs ok | daemon peak RSS MiB | vs off MiB | daemon CPU s | vs off s | run s "
        "| scrape ms (median) | scrape KiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        mine = [r for r in results if r.variant == variant]
        ok = [r for r in mine if r.exit_code == 0]
        rss, cpu = median(r.rss_kb for r in ok), median(r.cpu_s for r in ok)
        d_rss = None if rss is None or rss0 is None else (rss - rss0) / 1024
        d_cpu = None if cpu is None or cpu0 is None else cpu - cpu0
        scrapes = [ms for r in ok for ms in r.scrape_ms]
        size = median(r.scrape_bytes for r in ok)
        kib = None if size is None else size / 1024
        rows.append(
            f"| {LABELS[variant]} | {len(ok)}/{len(mine)} | {fmt(None if rss is None else rss / 1024, 1)} "
            f"| {fmt(d_rss, 1)} | {fmt(cpu)} | {fmt(d_cpu)} | {fmt(median(r.seconds for r in ok), 1)} "
            f"| {fmt(median(scrapes)) if scrapes else '-'} | {fmt(kib, 1)} |"
        )
    return "\n".join(rows)


def main(args: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="runs per variant (default 5)")
    p.add_argument("--workload", choices=["demo", "light"], default="demo")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one run may take")
    p.add_argument(
        "--out", type=Path, default=None, help="where runs leave their files (default: a temp dir)"
    )
    a = p.parse_args(args)
    out = a.out or Path(tempfile.mkdtemp(prefix="bench-metrics-"))
    become_subreaper()
    install_stop_handlers()
    results: list[Result] = []
    try:
        for i in range(a.runs):
            for variant in VARIANTS:
                r = run_once(variant, a.workload, out, i, a.timeout)
                results.append(r)
                print(f"run {i} {LABELS[variant]}: exit {r.exit_code}, rss {r.rss_kb} kB, cpu {r.cpu_s} s",
                      file=sys.stderr, flush=True)  # fmt: skip
    except Interrupted as why:
        print(f"interrupted ({why}): the runs so far", file=sys.stderr)
    print(f"workload {a.workload}, {a.runs} run(s) per variant, medians; files in {out}\n")
    print(table(results))
    return 0 if results and all(r.exit_code == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
