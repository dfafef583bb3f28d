"""nvidia-resiliency-ext's own fault-tolerance examples, unchanged, under ft-supervisor and
under NVRx's ft_launcher: the same example, the same fault, the same outcome?

    python scripts/bench/nvrx_examples.py [--runs N] [--examples heartbeats,sections]
                                          [--faults crash,hang] [--out DIR]

Each run starts one launcher (2 ranks on CPU, gloo, one restart allowed) with the
example vendored in tests/fixtures/ranks/nvrx_examples, the same ``--ft-*`` timeouts on
both, and, when rank 1 logs the start of epoch 1, sends rank 1 (its pid as the example
logs it) SIGKILL (crash) or SIGSTOP (hang): the signals of the examples' own
``--simulated_fault``, which picks a random rank after a random delay. Printed per run:
the launcher's exit code, the restarts, the rank its hang detection named (ft-supervisor:
its decision; ft_launcher: the ranks whose monitors logged an expired timeout, in that
order, else the worker its agent reported failed), seconds
from the fault to rank 1 training again, and the run's wall time.

ft_launcher comes from the nvidia-resiliency-ext installed beside ft-supervisor (the
test extra), torch from the same environment. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Launcher, become_subreaper, fmt, ft_event_log, install_stop_handlers, read_jsonl

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "tests" / "fixtures" / "ranks" / "nvrx_examples"
SCRIPTS = {"heartbeats": "train_ddp_heartbeats_api.py", "sections": "train_ddp_sections_api.py"}
TIMEOUTS = {
    "heartbeats": ["--ft-initial-rank-heartbeat-timeout", "60", "--ft-rank-heartbeat-timeout", "3"],
    "sections": ["--ft-rank-section-timeouts", "init:60,step:3,checkpoint:60",
                 "--ft-rank-out-of-section-timeout", "8"],
}  # fmt: skip
SMALL = ["--device", "cpu", "--hidden", "16", "--batch", "2", "--train_dataset_size", "160",
         "--val_dataset_size", "8", "--epochs", "4", "--logging_interval", "100",
         "--log_all_ranks"]  # fmt: skip
SIGNALS = {"crash": signal.SIGKILL, "hang": signal.SIGSTOP}
RUN_TIMEOUT = 300.0
# ft_launcher's rank monitors: "[time] [WARNING] [RankMonServer<pid>@<host>:<rank>] Did not get ..."
MONITOR = re.compile(r"\[RankMonServer\d*@[^\]:]*:(\d+)\]")
# torchrun's agent on a failed worker: "failed (exitcode: -9) local_rank: 1 (pid: ...)"
FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
EXPIRED = re.compile(r"Did not get (?:initial|subsequent) heartbeat|has been open for|Was out of section")


@dataclass
class Outcome:
    example: str
    fault: str
    launcher: str
    exit_code: int | None
    restarts: int
    blamed: str
    resumed_s: float | None
    wall_s: float


def _argv(launcher: str, example: str, out_dir: Path) -> list[str]:
    tail = [*TIMEOUTS[example], str(EXAMPLES / SCRIPTS[example]), *SMALL, "--output_dir", str(out_dir)]
    if launcher == "ft-supervisor":
        return [sys.executable, "-m", "supervisor", "run", "--log-dir", str(out_dir.parent / "logs"),
                "--nproc-per-node", "2", "--max-restarts", "1", *tail]  # fmt: skip
    ft_launcher = str(Path(sys.executable).parent / "ft_launcher")
    return [ft_launcher, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", *tail]


def _wait_for(path: Path, pattern: str, launcher: Launcher, deadline: float, after: int = 0) -> int | None:
    """The offset in the launcher's output where ``pattern`` first appears past ``after``."""
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace")
        found = text.find(pattern, after)
        if found >= 0:
            return found
        if launcher.poll(0.05, deadline):
            return None
    return None


def _blamed(launcher: str, run_dir: Path, text: str) -> str:
    if launcher == "ft-supervisor":
        log = ft_event_log(run_dir / "logs")
        events = read_jsonl(log) if log else []
        return ",".join(f"{e['rank']} ({e['rule']})" for e in events if e.get("event") == "decision") or "-"
    lines = [line for line in text.splitlines() if EXPIRED.search(line)]
    # each rank has its monitor; in the order their timeouts expired
    named = (MONITOR.search(line) for line in lines)
    ranks = list(dict.fromkeys(m.group(1) for m in named if m))
    if ranks:
        return " then ".join(ranks)
    failed = FAILED.search(text)  # no timeout: a worker's exit (one node: local rank = rank)
    return f"{failed.group(2)} (exit {failed.group(1)})" if failed else "-"


def run_once(example: str, fault: str, launcher_name: str, root: Path) -> Outcome:
    run_dir = Path(tempfile.mkdtemp(prefix=f"{example}-{fault}-{launcher_name}-", dir=root))
    launcher = Launcher(_argv(launcher_name, example, run_dir / "out"), run_dir)
    output = run_dir / "launcher.out"
    launcher.start()
    deadline = time.monotonic() + RUN_TIMEOUT
    resumed = None
    try:
        at = _wait_for(output, "1: CHECK TRAIN epoch:    1 iter:     0", launcher, deadline)
        if at is not None:
            pid = int(re.findall(r"RANK=1 PID=(\d+)", output.read_text(errors="replace"))[-1])
            os.kill(pid, SIGNALS[fault])
            faulted = time.monotonic()
            after = len(output.read_bytes())
            # rank 1 trains again: a new process logged its pid, then a training line
            again = _wait_for(output, "RANK=1 PID=", launcher, deadline, after)
            if again is not None and _wait_for(output, "1: CHECK TRAIN", launcher, deadline, again):
                resumed = time.monotonic() - faulted
        launcher.finish(deadline)
    except BaseException:
        launcher.abort()
        raise
    text = output.read_text(errors="replace")
    return Outcome(
        example, fault, launcher_name, launcher.run.exit_code,
        max(0, text.count("RANK=1 PID=") - 1), _blamed(launcher_name, run_dir, text), resumed,
        launcher.run.wall_s,
    )  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--examples", default="heartbeats,sections")
    p.add_argument("--faults", default="crash,hang")
    p.add_argument("--launchers", default="ft-supervisor,ft_launcher")
    p.add_argument("--out", type=Path, default=None, help="keep each run's files here")
    a = p.parse_args()
    become_subreaper()
    install_stop_handlers()
    root = a.out or Path(tempfile.mkdtemp(prefix="nvrx-examples-"))
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"{'example':<11} {'fault':<6} {'launcher':<14} {'exit':>4} {'restarts':>8} "
          f"{'blamed':<16} {'resumed s':>9} {'wall s':>7}")  # fmt: skip
    for _ in range(a.runs):
        for example in a.examples.split(","):
            for fault in a.faults.split(","):
                for launcher in a.launchers.split(","):
                    o = run_once(example, fault, launcher, root)
                    rows.append(o)
                    print(f"{o.example:<11} {o.fault:<6} {o.launcher:<14} {o.exit_code!s:>4} "
                          f"{o.restarts:>8} {o.blamed:<16} {fmt(o.resumed_s):>9} {fmt(o.wall_s, 1):>7}",
                          flush=True)  # fmt: skip
    print(f"runs kept in {root}")


if __name__ == "__main__":
    main()
