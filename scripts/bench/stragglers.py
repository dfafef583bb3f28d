"""Straggler detection against its targets (issue 15): how soon a 1.3x rank is
flagged, false positives in a healthy run, what the rank pays per step, what the
daemon pays.

How to run (from the repository root, in the project's virtualenv)::

    .venv/bin/python scripts/bench/stragglers.py                 # the targets' 10-minute healthy run
    .venv/bin/python scripts/bench/stragglers.py --minutes 1     # a short version

Method, default settings throughout (threshold 1.2, window 16 steps, warm-up 5,
sustained 10 s, evaluated once a second):

* **time to flag**: 2 ranks at 10 steps/s; rank 1 slows down 1.3x ``--onset`` s into
  the run (a fail-slow rank, not a slow start) and writes when; the figure is the
  time from then to its ``straggler_detected`` event. Two jobs: torch-free ranks
  that do not communicate (``tests/fixtures/ranks/straggling.py``, the daemon
  times their ``step`` sections), and a DDP job on gloo whose slow rank computes
  longer in its forward (``ddp_straggling.py``, timed by ``client.watch_ddp``).
* **healthy run**: 8 torch-free ranks at 10 steps/s for ``--minutes``, every rank
  evaluating 2 s every 50 steps and rank 0 saving a checkpoint (1.5 s) every 100;
  the figure is the number of ``straggler_detected`` events (target: none). Every
  step also waits 1 ms in ``client.waiting()``, so the client measures the steps
  and sends one timing message each: the daemon's heaviest input.
* **daemon CPU**: the same healthy run with ``--straggler-detection off``; the
  daemon's CPU (its ``run_finished`` event) over the run's seconds, as a share of
  one core, both ways.
* **rank cost per step**: in this process, DDP (world size 1, gloo, a 16x16 linear
  layer) stepping with DDP's own all-reduce hook vs ``client.watch_ddp`` (the
  same hook, timed, plus a timing message to a real ZeroMQ socket), medians of
  per-step times interleaved in blocks; and the timer's own path alone (two
  buckets and a message) in a loop. Both against a 100 ms step (10 steps/s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    Interrupted,
    Launcher,
    become_subreaper,
    fmt,
    ft_event_log,
    install_stop_handlers,
    read_jsonl,
)

REPO = Path(__file__).resolve().parents[2]
RANKS = REPO / "tests" / "fixtures" / "ranks"


def _events(run_dir: Path) -> list[dict[str, object]]:
    log = ft_event_log(run_dir / "logs")
    return read_jsonl(log) if log else []


def _daemon(run_dir: Path, nproc: int, program: list[str], *extra: str, sample: float = 0.05) -> Launcher:
    argv = [sys.executable, "-m", "supervisor", "run", "--nproc-per-node", str(nproc), "--log-dir",
            str(run_dir / "logs"), "--rdzv-id", "bench", *extra, *program]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    launcher = Launcher(argv, run_dir, env=env, sample_interval=sample)
    launcher.start()
    return launcher


def time_to_flag(kind: str, out: Path, onset: float, timeout: float) -> tuple[float | None, object]:
    """Seconds from the rank's slow-down to its straggler_detected event, and the score."""
    run_dir = out / f"flag-{kind}"
    run_dir.mkdir(parents=True)
    onset_file = run_dir / "onset"
    script = "straggling.py" if kind == "no-comm" else "ddp_straggling.py"
    program = [str(RANKS / script), "--steps", "1000000", "--step-time", "0.1", "--slow-rank", "1",
               "--factor", "1.3", "--slow-after", str(onset), "--onset-file", str(onset_file)]  # fmt: skip
    extra = ("--ft-rank-section-timeouts", "step:none") if kind == "no-comm" else ()
    launcher = _daemon(run_dir, 2, program, *extra)
    deadline = time.monotonic() + timeout
    found: list[dict[str, object]] = []
    try:
        while not launcher.poll(0.5, deadline) and time.monotonic() < deadline:
            found = [e for e in _events(run_dir) if e["event"] == "straggler_detected"]
            if found:
                break
    finally:
        launcher.finish(time.monotonic())  # stop it now, and whatever it left behind
    if not found or not onset_file.exists():
        return None, None
    ranks = {e["rank"] for e in found}
    if ranks != {1}:
        print(f"{kind}: flagged ranks {sorted(ranks)} (expected only rank 1)", file=sys.stderr)
    first = found[0]
    return float(str(first["t_wall"])) - float(onset_file.read_text()), first["score"]


def healthy(out: Path, minutes: float, detection: str) -> tuple[int, float | None, float]:
    """(straggler_detected events, the daemon's CPU share of a core while the ranks stepped,
    the seconds that share is over)."""
    run_dir = out / f"healthy-{detection}"
    run_dir.mkdir(parents=True)
    seconds = minutes * 60
    program = [str(RANKS / "straggling.py"), "--steps", "100000000", "--seconds", str(seconds),
               "--step-time", "0.099", "--wait-time", "0.001", "--eval-every", "50", "--eval-time", "2",
               "--save-every", "100", "--save-time", "1.5"]  # fmt: skip
    launcher = _daemon(run_dir, 8, program, "--straggler-detection", detection,
                       "--ft-rank-section-timeouts", "step:none,checkpointing:none", sample=0.25)  # fmt: skip
    launcher.finish(time.monotonic() + seconds + 120)
    events = _events(run_dir)
    flagged = sum(1 for e in events if e["event"] == "straggler_detected")
    stepping = [float(str(e["t_wall"])) for e in events if e["event"] == "rank_stepping"]
    exits = [float(str(e["t_wall"])) for e in events if e["event"] == "rank_exited"]
    if not stepping or not exits:
        return flagged, None, 0.0
    # the steady state: every rank stepping, none leaving (start-up is the same either way)
    t0, t1 = max(stepping) + 2.0, min(exits) - 1.0
    cpu = launcher.run.cpu_between(t0, t1)
    return flagged, None if cpu is None else 100 * cpu / (t1 - t0), t1 - t0


def rank_cost(steps: int) -> tuple[float, float, float]:
    """(µs per step added by watch_ddp in a DDP step, µs of the timer's own path, a plain DDP step in ms)."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    import zmq  # noqa: PLC0415
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: PLC0415
    from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415

    from supervisor.client.channel import Channel  # noqa: PLC0415
    from supervisor.client.timing import StepTimer, ddp_hook  # noqa: PLC0415
    from supervisor.transport.schema import encode  # noqa: PLC0415

    tmp = Path(tempfile.mkdtemp(prefix="bench-stragglers-"))
    endpoint = f"ipc://{tmp}/ranks.sock"
    context = zmq.Context()
    sink = context.socket(zmq.ROUTER)
    sink.bind(endpoint)
    channel = Channel(endpoint)

    def send(work: float, wait: float) -> None:  # as the client does
        channel.send(encode("timing", rank=0, gen=0, k="0" * 32, work=round(work, 6), wait=round(wait, 6)))

    def drain() -> None:
        while sink.poll(0):
            sink.recv_multipart()

    store = dist.FileStore(str(tmp / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    x = torch.randn(8, 16)
    models = {}
    for name in ("plain", "timed"):
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(16, 16))
        model.register_comm_hook(None, default_hooks.allreduce_hook if name == "plain" else
                                 ddp_hook(StepTimer(send)))  # fmt: skip
        models[name] = (model, torch.optim.SGD(model.parameters(), lr=0.01))
    times: dict[str, list[float]] = {"plain": [], "timed": []}
    for _ in range(max(1, steps // 100)):
        for name, (model, opt) in models.items():
            for _ in range(100):
                t0 = time.perf_counter()
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
                times[name].append(time.perf_counter() - t0)
            drain()
    dist.destroy_process_group()
    timer = StepTimer(send)
    timer.ddp = True
    n = 20_000
    t0 = time.perf_counter()
    for i in range(n):
        timer.bucket_ready(False)
        timer.bucket_ready(True)
        timer.bucket_done()
        timer.bucket_done()
        if i % 1000 == 0:
            drain()
    own = (time.perf_counter() - t0) / n
    channel.close()
    sink.close(0)
    context.term()
    plain, timed = statistics.median(times["plain"]), statistics.median(times["timed"])
    return (timed - plain) * 1e6, own * 1e6, plain * 1e3


def main(args: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="the healthy run's length (default 10)")
    p.add_argument("--onset", type=float, default=15.0, help="seconds before rank 1 slows down (default 15)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a time-to-flag run may take")
    p.add_argument("--steps", type=int, default=3000, help="DDP steps per variant for the rank's cost")
    p.add_argument("--out", type=Path, default=None, help="where runs leave their files (default: temp)")
    a = p.parse_args(args)
    out = a.out or Path(tempfile.mkdtemp(prefix="bench-stragglers-"))
    become_subreaper()
    install_stop_handlers()
    rows: list[str] = []
    try:
        added, own, step_ms = rank_cost(a.steps)
        rows.append(f"| rank: watch_ddp's cost per DDP step (median, vs DDP's own hook) | {fmt(added, 1)} µs "
                    f"= {fmt(added / 1e3, 3)} % of a 100 ms step (a bare step here: {fmt(step_ms, 2)} ms) "
                    "| < 1 % |")  # fmt: skip
        rows.append(f"| rank: the timer's own path (2 buckets + a message) | {fmt(own, 1)} µs "
                    f"= {fmt(own / 1e3, 3)} % of a 100 ms step | < 1 % |")  # fmt: skip
        for kind in ("no-comm", "ddp"):
            seconds, score = time_to_flag(kind, out, a.onset, a.timeout)
            said = f"{fmt(seconds, 1)} s ({score})"
            rows.append(f"| time to flag a 1.3x rank, {kind} (score) | {said} | < 60 s |")
            print(rows[-1], file=sys.stderr, flush=True)
        flagged, on, secs = healthy(out, a.minutes, "on")
        rows.append(f"| healthy run, 8 ranks, {a.minutes:g} min with evaluation and checkpoints: flagged "
                    f"| {flagged} | 0 |")  # fmt: skip
        print(rows[-1], file=sys.stderr, flush=True)
        _, off, _ = healthy(out, a.minutes, "off")
        for label, share in (("on", on), ("off", off)):
            measured = f"{fmt(share, 2)} % of a core (over {fmt(secs, 0)} s of steady stepping)"
            rows.append(f"| daemon CPU, 8 ranks at 10 steps/s, detection {label} | {measured} "
                        "| detection's share < 2 % |")  # fmt: skip
    except Interrupted as why:
        print(f"interrupted ({why}): the figures so far", file=sys.stderr)
    print(f"files in {out}\n")
    print("| figure | measured | target |\n|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
