"""Job-wide blame benchmark (issue 26): is the culprit of a hang named right, and alike, on every node?

How to run (from the repository root, in the project's virtualenv)::

    env -u PYTHONUNBUFFERED .venv/bin/python scripts/bench/blame.py         # 4 trials per fault, 2 nodes
    env -u PYTHONUNBUFFERED .venv/bin/python scripts/bench/blame.py --nodes 2,4 --trials 2 --out /tmp/b
    env -u PYTHONUNBUFFERED .venv/bin/python scripts/bench/blame.py --faults own_code,desync_op --seed 7

Method
------
A "node" is one ``ft-supervisor run`` daemon on this machine; ``N`` of them (``--nodes``)
with 2 gloo ranks each form one job over loopback, the rendezvous store hosted by this
script (a ``TCPStore``, as tests/integration/test_job_blame.py hosts it: a stable
endpoint that outlives any daemon)::

    python -m supervisor run --nnodes N --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint 127.0.0.1:PORT --rdzv-id ID --local-addr 127.0.0.1 \\
        --rdzv-conf is_host=0,keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1,... \\
        --max-restarts 1 --no-standby --ft-rank-section-timeouts step:S --node-state-dir DIR \\
        scripts/bench/_blame_rank.py --fault F --culprit R

Every rank all-reduces 8 floats per step (``_blame_rank.py``); in generation 0, at step 6,
global rank R misbehaves (``--fault``, see that script): ``own_code`` (sleeps in its own
function), ``before_coll`` (blocks on a pipe right before the all_reduce), ``sigstop``
(stops itself), ``desync_op`` (all_gather against all_reduce), ``desync_size`` (16 floats
against 8), ``slow`` (computes ``--slow`` s, past the ``step`` timeout ``S``, then goes on).
R is drawn per trial (``--seed``) from all ranks of the job: its node is R // 2 (torchrun's
node-major placement; each daemon's node rank is read from its ``rendezvous_joined``).

Per trial, from every node's ``events.jsonl`` and ``reason.json``:

* the culprit each node named: the ``job_blame`` event's ranks, nodes and rule (none: the
  node gave no verdict); *right* when it names exactly R and R's node;
* agreed: every node named the same ranks, nodes and rule;
* a healthy node charged: a node other than R's with ``rank_hung`` against its own ranks
  or ``node_health_marked`` in generation 0;
* for a desync: aborted on its first occurrence (every daemon exited 2, reason.json
  ``restarts_used`` 0, outcome abort);
* each node's first generation-0 ``decision`` (action, reason, rank): where no verdict came
  (a crash rather than a hang), the blame the crash path gave; a healthy node deciding
  ``rank_failed`` (one of its ranks failed) instead of following the culprit's node;
* the seconds from the first node's declaration to each node's verdict (the event's
  ``seconds``), and of those the node's own gathering (``gathered``: stacks and dumps);
  the size of the largest node summary in ``job-blame.json`` (bound 64 KiB).

Faults run interleaved (one trial of each, then again) so that a busy moment of the
machine hurts them alike. Each trial has a deadline (``--timeout``); past it every daemon's
process group gets SIGTERM then SIGKILL. Every daemon runs in its own session; this script
is a child subreaper and kills (and reports) whatever is left after a trial. Artifacts stay
in ``--out`` (default: a fresh temporary directory): ``<N>n-<fault>-<i>/node-<j>/``,
``results.json``. Linux only. Needs torch (the store) in the interpreter that runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    LEFTOVER_GRACE,
    Interrupted,
    become_subreaper,
    fmt,
    ft_event_log,
    install_stop_handlers,
    kill_leftovers,
    killpg,
    median,
    read_jsonl,
)

ROOT = Path(__file__).resolve().parents[2]
RANK_SCRIPT = Path(__file__).resolve().parent / "_blame_rank.py"
FAULTS = ("own_code", "before_coll", "sigstop", "desync_op", "desync_size", "slow")
DESYNC = ("desync_op", "desync_size")
NPROC = 2
SUMMARY_BOUND = 64 * 1024


@dataclass
class Trial:
    nodes: int
    fault: str
    index: int
    culprit: int
    culprit_node: int
    wall_s: float = 0.0
    exits: list[int | None] = field(default_factory=list)
    named: dict[int, Any] = field(default_factory=dict)  # node rank -> [ranks, nodes, rule] or None
    seconds: dict[int, float | None] = field(default_factory=dict)
    gathered: dict[int, float | None] = field(default_factory=dict)  # of those, the node's own gather
    # node rank -> generation 0's [action, reason, rank]
    decided: dict[int, Any] = field(default_factory=dict)
    charged: list[int] = field(default_factory=list)  # healthy nodes charged
    aborted_first: bool | None = None
    summary_max_bytes: int | None = None
    leftovers: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def right_everywhere(self) -> bool:
        want = [[self.culprit], [self.culprit_node]]
        return len(self.named) == self.nodes and all(
            v is not None and v[:2] == want for v in self.named.values()
        )

    @property
    def agreed(self) -> bool:
        vals = list(self.named.values())  # nodes that all gave no verdict did not agree on one
        return len(vals) == self.nodes and vals[0] is not None and all(v == vals[0] for v in vals)


def free_port() -> int:
    from supervisor.process.ports import free_port as port  # noqa: PLC0415

    return port()


def node_argv(s: argparse.Namespace, endpoint: str, run_id: str, node_dir: Path, t: Trial) -> list[str]:
    conf = "is_host=0,keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=60"
    return [
        sys.executable, "-m", "supervisor", "run", "--log-dir", str(node_dir / "logs"), "--rdzv-id", run_id,
        "--nnodes", str(t.nodes), "--nproc-per-node", str(NPROC), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--local-addr", "127.0.0.1", "--rdzv-conf", conf,
        "--max-restarts", "1", "--no-standby", "--ft-rank-section-timeouts", f"step:{s.section_timeout:g}",
        "--node-state-dir", str(node_dir / "state"),
        str(RANK_SCRIPT), "--fault", t.fault, "--culprit", str(t.culprit), "--slow", f"{s.slow:g}",
    ]  # fmt: skip


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            killpg(p.pid, signal.SIGKILL)
            p.wait()


def run_trial(s: argparse.Namespace, t: Trial, out: Path) -> None:
    from torch.distributed import TCPStore  # noqa: PLC0415 - the job's stable rendezvous endpoint

    trial_dir = out / f"{t.nodes}n-{t.fault}-{t.index}"
    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True, wait_for_workers=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run_id, procs = uuid.uuid4().hex[:8], []
    started = time.monotonic()
    try:
        for j in range(t.nodes):
            node_dir = trial_dir / f"node-{j}"
            node_dir.mkdir(parents=True)
            argv = node_argv(s, f"127.0.0.1:{port}", run_id, node_dir, t)
            with (node_dir / "daemon.out").open("wb") as o:
                procs.append(
                    subprocess.Popen(argv, stdout=o, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=node_dir, start_new_session=True)
                )  # fmt: skip
        deadline = started + s.timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        if any(p.poll() is None for p in procs):
            t.note = f"timed out after {s.timeout:g} s"
    finally:
        stop(procs)
        t.wall_s = time.monotonic() - started
        t.exits = [p.returncode for p in procs]
        t.leftovers = kill_leftovers(LEFTOVER_GRACE)
        del store
    analyse(t, trial_dir)


def analyse(t: Trial, trial_dir: Path) -> None:
    sizes: list[int] = []
    aborted = []
    for j in range(t.nodes):
        log = ft_event_log(trial_dir / f"node-{j}" / "logs")
        events = read_jsonl(log) if log else []
        joined = [e for e in events if e["event"] == "rendezvous_joined" and e.get("generation") == 0]
        if not joined:
            t.note += f" node-{j}: never joined;"
            continue
        node = joined[0]["node_rank"]
        blame = [e for e in events if e["event"] == "job_blame"]
        t.named[node] = [blame[0]["ranks"], blame[0]["nodes"], blame[0]["rule"]] if blame else None
        t.seconds[node] = blame[0].get("seconds") if blame else None
        t.gathered[node] = blame[0].get("gathered") if blame else None
        gen0 = [e for e in events if e.get("generation") == 0]
        decision = [e for e in gen0 if e["event"] == "decision"]
        t.decided[node] = (
            [decision[0]["action"], decision[0]["reason"], decision[0].get("rank")] if decision else None
        )
        if node != t.culprit_node and any(e["event"] in ("rank_hung", "node_health_marked") for e in gen0):
            t.charged.append(node)
        for e in events:
            if e["event"] == "hang_bundle":
                path = Path(e["path"]) / "job-blame.json"
                if path.exists():
                    job = json.loads(path.read_text())
                    sizes += [len(json.dumps(x, separators=(",", ":"))) for x in job.get("summaries", [])]
        reason_path = log.parent / "reason.json" if log else None
        reason = json.loads(reason_path.read_text()) if reason_path and reason_path.exists() else {}
        aborted.append(reason.get("outcome") == "abort" and reason.get("restarts_used") == 0)
    t.summary_max_bytes = max(sizes) if sizes else None
    if t.fault in DESYNC:
        t.aborted_first = all(aborted) and len(aborted) == t.nodes and all(x == 2 for x in t.exits)


def from_json(raw: dict[str, Any]) -> Trial:
    """A trial from results.json (JSON turned the node ranks into strings)."""
    t = Trial(**raw)
    t.named, t.seconds, t.decided, t.gathered = (
        {int(k): v for k, v in d.items()} for d in (t.named, t.seconds, t.decided, t.gathered)
    )
    return t


def pct(k: int, n: int) -> str:
    return f"{100 * k / n:.0f} %" if n else "n/a"


def self_failed(t: Trial) -> int:
    """Healthy nodes whose own decision was a failure of one of their ranks (``rank_failed``:
    a gloo error from the culprit's node stopping its ranks first) rather than following."""
    return sum(
        1 for n, d in t.decided.items() if n != t.culprit_node and d is not None and d[1] == "rank_failed"
    )


def table(trials: list[Trial]) -> str:
    head = (
        "| nodes | fault | trials | named right on every node | agreed | healthy node charged "
        "| healthy node decided rank_failed "
        "| desync aborted first time | decided after 1st declaration median / max s "
        "| of which gathering median / max s | summary max bytes |"
    )
    lines = [head, "|" + "---|" * 11]
    for n in sorted({t.nodes for t in trials}):
        for f in FAULTS:
            ts = [t for t in trials if t.nodes == n and t.fault == f]
            if not ts:
                continue
            secs = [x for t in ts for x in t.seconds.values() if x is not None]
            gath = [x for t in ts for x in t.gathered.values() if x is not None]
            desync = pct(sum(bool(t.aborted_first) for t in ts), len(ts)) if f in DESYNC else "-"
            sizes = [t.summary_max_bytes for t in ts if t.summary_max_bytes is not None]
            lines.append(
                f"| {n} | {f} | {len(ts)} | {pct(sum(t.right_everywhere for t in ts), len(ts))} "
                f"| {pct(sum(t.agreed for t in ts), len(ts))} | {sum(len(t.charged) for t in ts)} "
                f"| {sum(self_failed(t) for t in ts)} | {desync} "
                f"| {fmt(median(secs))} / {fmt(max(secs) if secs else None)} "
                f"| {fmt(median(gath))} / {fmt(max(gath) if gath else None)} "
                f"| {max(sizes) if sizes else 'n/a'} |"
            )
    return "\n".join(lines)


def describe(t: Trial) -> str:
    named = "; ".join(f"node {k}: {v}" for k, v in sorted(t.named.items()))
    secs = ", ".join(fmt(v) for _, v in sorted(t.seconds.items()))
    return (
        f"{t.nodes}n {t.fault} #{t.index}: culprit rank {t.culprit} node {t.culprit_node}; {named}; "
        f"decided={dict(sorted(t.decided.items()))} right={t.right_everywhere} charged={t.charged} "
        f"aborted_first={t.aborted_first} "
        f"s=[{secs}] exits={t.exits} wall={t.wall_s:.0f}s {t.note}".strip()
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="2", help="comma-separated node counts (2,4)")
    p.add_argument("--trials", type=int, default=4, help="trials per fault and node count")
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--section-timeout", type=float, default=2.0, help="the ranks' step section timeout (s)")
    p.add_argument("--slow", type=float, default=6.0, help="seconds the slow rank computes")
    p.add_argument("--timeout", type=float, default=150.0, help="per trial (s)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--report", type=Path, nargs="*", help="print the table of earlier results.json files, run nothing"
    )
    s = p.parse_args(argv)
    s.nodes = [int(x) for x in s.nodes.split(",")]
    s.faults = [f for f in s.faults.split(",") if f]
    unknown = set(s.faults) - set(FAULTS)
    if unknown:
        p.error(f"unknown fault(s): {sorted(unknown)}")
    return s


def main(argv: list[str] | None = None) -> int:
    s = parse_args(argv)
    if s.report:
        print(table([from_json(x) for path in s.report for x in json.loads(path.read_text())]))
        return 0
    out = s.out or Path(tempfile.mkdtemp(prefix="bench-blame-"))
    out.mkdir(parents=True, exist_ok=True)
    become_subreaper()
    install_stop_handlers()
    rng = random.Random(s.seed)
    trials: list[Trial] = []
    load = [os.getloadavg()]
    try:
        for n in s.nodes:
            for i in range(s.trials):
                for f in s.faults:
                    culprit = rng.randrange(n * NPROC)
                    t = Trial(n, f, i, culprit, culprit // NPROC)
                    run_trial(s, t, out)
                    trials.append(t)
                    print(describe(t), flush=True)
                    (out / "results.json").write_text(json.dumps([asdict(x) for x in trials], indent=1))
    except Interrupted as e:
        print(f"stopped ({e}); what was measured so far:", flush=True)
    load.append(os.getloadavg())
    print(f"\nload average at start {load[0]}, at end {load[-1]}; artifacts in {out}\n")
    print(table(trials))
    return 0


if __name__ == "__main__":
    sys.exit(main())
