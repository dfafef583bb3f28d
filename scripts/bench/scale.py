"""What the job-wide agreement costs at N nodes: many simulated nodes, one real TCPStore.

How to run (from the repository root, in the project's virtualenv)::

    .venv/bin/python scripts/bench/scale.py                         # N = 16, 64, 128; ~3 min
    .venv/bin/python scripts/bench/scale.py --nodes 16,64,256 --runs 3   # 256: ~5 min a run
    .venv/bin/python scripts/bench/scale.py --memory                # a node's daemon: RSS/PSS, start-up

Method
------
A "node" is one ``supervisor.coord.job.RendezvousJob``, the object a daemon
drives: the real rendezvous (torch's dynamic rendezvous on the c10d backend, its
keep-alive thread, our watch and agreement), without ranks. ``N`` of them live in
one process (``--child``), each with its own TCPStore client, against one real
torch TCPStore hosted by a process of its own (so that its CPU is its own). torch's
TCPStore counts nothing, so every node reaches it through a counting TCP proxy
(``_store_proxy.py``, a third process): a request is a burst of bytes from a client
after the store last answered on that connection, its type the first byte.

One run, for one ``N``:

1. the nodes reach the store 8 at a time (the store's TCP connects sometimes take
   5 s here when many come at once) and join one rendezvous round (``--nnodes N:N``),
   5 ms apart so that torch's compare-and-set join does not turn into N contending
   writers;
2. once every node's wait connections are open (in the background, as a round
   starts), at rest: every node watches its peers (``RendezvousJob.watch``) as a daemon
   does while its ranks run; after ``--settle`` s, the store requests, the
   store's CPU and the nodes' CPU are counted over ``--rest`` s;
3. a failure: the last node announces that its generation ended
   (``announce_end``, as the daemon does when a rank fails) and publishes a
   failed outcome (``agree`` with a restart for a rank failure); each other node,
   as soon as its watch returns, publishes its outcome (it follows: restart,
   peer_failed) and waits for everyone's (``agree``). "learn" is the time from
   the announcement to the last node's watch returning, "agree" to the last
   node's ``agree`` returning with every node's outcome. Each node then applies
   ``core.jobwide.joint``: all must reach the same decision (checked).

torch's keep-alive is its own: every ``keep_alive_interval`` each node rewrites the
whole rendezvous state by compare-and-set, and since all nodes start their timers
when the round completes, they all write at once: N^2/2 attempts, each with the
whole state. In one process, at 64 nodes and torch's default 5 s, 29 of them
timed out (torch's 5 s heartbeat timeout) and those nodes' heartbeats went stale:
the watch then rightly reported them lost. So the harness uses 30 s
(``--keep-alive``); the table counts the keep-alives that failed. The join is not
measured: nodes waiting for the round look at torch's state at torch's own pace
(``JOIN_POLL``), without our quickened start of a round (N nodes in one process).

Times are taken when each node's coroutine resumes in the shared event loop: with
1,024 nodes in one process that includes waiting for the loop (an upper bound).
The nodes' CPU, divided by ``N``, is a node's daemon CPU for the rendezvous at rest,
torch's keep-alive thread included. Runs of different ``N`` are interleaved;
medians of ``--runs``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import CLK_TCK, fmt, median, read_stat

HERE = Path(__file__).resolve().parent
JOIN_POLL = 1.0  # s between looks of a node waiting for the round to fill (torch: 1)
STORE_HOST = (
    "import sys, torch.distributed as d\n"
    "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
    "print(s.port, flush=True)\n"
    "sys.stdin.read()\n"
)


# -- the nodes (child process) -------------------------------------------------------------


class _KeepAliveMisses(logging.Handler):
    """torch's keep-alive that failed (its compare-and-set timed out): counted."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "failed to send a keep-alive" in record.getMessage():
            self.count += 1


class _Quiet:
    """The daemon's event log, as the coord layer sees it: dropped here."""

    def emit(self, event: str, level: int = 20, *, quiet: tuple[str, ...] = (), **fields: Any) -> None:
        return None


async def _nodes(n: int, port: int, keep_alive: int, settle: float, rest: float) -> dict[str, Any]:
    from supervisor.config.rendezvous import RdzvConfig  # noqa: PLC0415
    from supervisor.coord.job import RendezvousJob  # noqa: PLC0415
    from supervisor.core.jobwide import NodeOutcome, joint  # noqa: PLC0415
    from supervisor.core.types import Action, Reason  # noqa: PLC0415

    conf = {"is_host": "0", "keep_alive_interval": str(keep_alive), "keep_alive_max_attempt": "3",
            "join_timeout": "600", "last_call_timeout": "1"}  # fmt: skip
    cfg = RdzvConfig("c10d", f"127.0.0.1:{port}", "scale", n, n, local_addr="127.0.0.1", conf=conf)
    from supervisor.coord import torchrdzv  # noqa: PLC0415

    # Not measured, only made to fit one process: while the round fills, each node
    # looks at torch's state every second (its size grows with N), N^2 reads of it in
    # all. Here nodes waiting for the round look every JOIN_POLL s instead.
    torchrdzv.FAST_WINDOW = 0.0
    torch_delay = torchrdzv._torch_delay

    def delay(seconds: float | tuple[float, float]) -> None:
        if seconds == 1:
            time.sleep(JOIN_POLL)
        else:
            torch_delay(seconds)

    torchrdzv._torch_delay = delay
    jobs = [RendezvousJob(cfg, 30000 + i, _Quiet()) for i in range(n)]
    missed = _KeepAliveMisses()
    logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous").addHandler(missed)
    t0 = time.monotonic()
    for i in range(0, n, 8):  # torch's store drops connections that come all at once; they retry late
        await asyncio.gather(*(j.start() for j in jobs[i : i + 8]))
    print(f"{n} nodes reached the store in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    joins = []
    for i, j in enumerate(jobs):
        joins.append(asyncio.ensure_future(j.join(0)))
        await asyncio.sleep(0.005)
        if i % 64 == 63:
            print(f"{i + 1} nodes joining after {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    gens = await asyncio.gather(*joins)
    joined_s = time.monotonic() - t0
    print(f"{n} nodes joined in {joined_s:.1f} s", file=sys.stderr, flush=True)
    by_rank = {g.node_rank: (j, g) for j, g in zip(jobs, gens, strict=True)}

    # each node opens its round's wait connections in the background; the job is at
    # rest once they are open (here, with N nodes connecting at once, that takes a while)
    opened = time.monotonic()
    listeners = [getattr(g.joined, "listeners", None) for g in gens]  # None: the old protocol
    while not all(lis is None or lis.ready() for lis in listeners):
        await asyncio.sleep(0.1)
        if time.monotonic() - opened > 300:
            break
    opened_s = time.monotonic() - opened
    print(f"{n} nodes' wait connections open after {opened_s:.1f} s", file=sys.stderr, flush=True)
    watches = {r: asyncio.ensure_future(j.watch(g)) for r, (j, g) in by_rank.items()}
    await asyncio.sleep(settle)
    print(json.dumps({"phase": "rest"}), flush=True)  # the parent starts counting
    cpu0 = time.process_time()
    await asyncio.sleep(rest)
    cpu_rest = time.process_time() - cpu0
    print(json.dumps({"phase": "failure"}), flush=True)  # the parent reads the counts
    sys.stdin.readline()  # ... and says when it has

    early = [w for w in watches.values() if w.done()]  # news before the failure: a false alarm
    if early:
        news = early[0].exception() or early[0].result()
        print(f"{len(early)} node(s) heard news at rest: {news}", file=sys.stderr, flush=True)
    failed = n - 1
    learned: dict[int, float] = {}
    agreed: dict[int, float] = {}
    decisions: dict[int, Action] = {}

    async def follower(rank: int) -> None:
        job, gen = by_rank[rank]
        _news, detail = await watches[rank]
        learned[rank] = time.monotonic()
        own = NodeOutcome(rank, Action.RESTART, Reason.PEER_FAILED, detail)
        outcomes = await job.agree(gen, own)
        agreed[rank] = time.monotonic()
        decisions[rank] = joint(own, outcomes) if len(outcomes) == n else Action.ABORT

    async def failing() -> None:
        job, gen = by_rank[failed]
        watches[failed].cancel()
        await job.announce_end(gen, "generation 0 failed")
        own = NodeOutcome(failed, Action.RESTART, Reason.RANK_FAILED, "rank 0 raised")
        outcomes = await job.agree(gen, own)
        agreed[failed] = time.monotonic()
        decisions[failed] = joint(own, outcomes) if len(outcomes) == n else Action.ABORT

    t_fail = time.monotonic()
    cpu0 = time.process_time()
    await asyncio.wait_for(asyncio.gather(failing(), *(follower(r) for r in by_rank if r != failed)), 300)
    return {
        "n": n,
        "joined_s": joined_s,
        "nodes_cpu_rest": cpu_rest / rest,
        "learn_s": max(learned.values()) - t_fail,
        "agree_s": max(agreed.values()) - t_fail,
        "failure_cpu_s": time.process_time() - cpu0,
        "same_decision": set(decisions.values()) == {Action.RESTART} and len(decisions) == n,
        "keep_alive_missed": missed.count,
        "listeners_open_s": opened_s,
        "news_at_rest": len(early),
    }


def child(args: argparse.Namespace) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where the nodes are: kill -USR1
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = asyncio.run(_nodes(args.child, args.port, args.keep_alive, args.settle, args.rest))
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)  # thousands of rendezvous threads: no orderly teardown needed


# -- one run (parent) ----------------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    st = read_stat(pid)
    return 0.0 if st is None else st.cpu_ticks / CLK_TCK


def one_run(n: int, args: argparse.Namespace) -> dict[str, Any]:
    py = sys.executable
    code = os.environ.get("PYTHONPATH") or str(HERE.parents[1])  # another tree's code: before/after
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONPATH": code}
    procs: list[subprocess.Popen[str]] = []
    err = open(args.stderr, "a")  # noqa: SIM115 - closed below
    try:
        store = subprocess.Popen([py, "-c", STORE_HOST], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=err, text=True, env=env)  # fmt: skip
        procs.append(store)
        assert store.stdout is not None
        store_port = int(store.stdout.readline())
        proxy = subprocess.Popen([py, str(HERE / "_store_proxy.py"), str(store_port)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=err, text=True, env=env)  # fmt: skip
        procs.append(proxy)
        assert proxy.stdout is not None and proxy.stdin is not None
        port = int(proxy.stdout.readline())

        def counts() -> dict[str, Any]:
            assert proxy.stdin is not None and proxy.stdout is not None
            proxy.stdin.write("\n")
            proxy.stdin.flush()
            got: dict[str, Any] = json.loads(proxy.stdout.readline())
            return got

        nodes = subprocess.Popen(
            [py, __file__, "--child", str(n), "--port", str(port), "--keep-alive", str(args.keep_alive),
             "--settle", str(args.settle), "--rest", str(args.rest)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
        )  # fmt: skip
        procs.append(nodes)
        assert nodes.stdout is not None and nodes.stdin is not None
        line = nodes.stdout.readline()  # rest begins
        if not line:
            raise RuntimeError(f"{n} nodes: the nodes' process died (see {args.stderr})")
        c0, s0, t0 = counts(), _cpu_s(store.pid), time.monotonic()
        nodes.stdout.readline()  # rest ends
        c1, s1, t1 = counts(), _cpu_s(store.pid), time.monotonic()
        nodes.stdin.write("\n")
        nodes.stdin.flush()
        result: dict[str, Any] = json.loads(nodes.stdout.readline())
        c2 = counts()
        span = t1 - t0
        reqs0, reqs1, reqs2 = (sum(c["requests"].values()) for c in (c0, c1, c2))
        kinds = {k: (v - c0["requests"].get(k, 0)) / span for k, v in c1["requests"].items()}
        result.update(
            rest_rps=(reqs1 - reqs0) / span,
            rest_kinds={k: round(v, 1) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v >= 0.05},
            rest_mbps=(c1["down"] + c1["up"] - c0["down"] - c0["up"]) / span / 1e6,
            store_cpu=(s1 - s0) / span,
            failure_requests=reqs2 - reqs1,
        )
        return result
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(10)
        err.close()


def table(results: dict[int, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    rows = [
        "| nodes | store requests/s at rest | store MB/s at rest | all learn s | all agree s "
        "| requests per failure | store CPU at rest | per-node CPU at rest | join s | keep-alives failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, runs in sorted(results.items()):
        ok = [r for r in runs if r.get("same_decision")]
        med = {k: median(r[k] for r in runs) for k in ("rest_rps", "rest_mbps", "learn_s", "agree_s",
               "failure_requests", "store_cpu", "nodes_cpu_rest", "joined_s")}  # fmt: skip
        per_node = None if med["nodes_cpu_rest"] is None else med["nodes_cpu_rest"] / n
        agree = fmt(med["agree_s"]) + ("" if len(ok) == len(runs) else f" ({len(runs) - len(ok)} disagreed)")
        rows.append(
            f"| {n} | {fmt(med['rest_rps'], 0)} | {fmt(med['rest_mbps'], 2)} | {fmt(med['learn_s'])} "
            f"| {agree} "
            f"| {fmt(med['failure_requests'], 0)} | {fmt(100 * (med['store_cpu'] or 0), 1)} % "
            f"| {fmt(100 * (per_node or 0), 3)} % | {fmt(med['joined_s'], 1)} "
            f"| {fmt(median(r['keep_alive_missed'] for r in runs), 0)} |"
        )
    kinds = {n: runs[-1]["rest_kinds"] for n, runs in sorted(results.items()) if runs}
    rows.append("")
    rows.append(f"requests/s at rest by kind (last run): {json.dumps(kinds)}")
    rows.append(f"keep_alive_interval={args.keep_alive} s, {args.rest} s at rest after {args.settle} s, "
                f"medians of {args.runs} run(s); CPU in % of one core")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="16,64,128", help="comma-separated node counts")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--rest", type=float, default=5.0, help="seconds at rest counted")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds at rest before counting")
    parser.add_argument("--keep-alive", type=int, default=30, help="torch's keep_alive_interval (Method)")
    parser.add_argument("--stderr", default="/tmp/ft-scale.stderr", help="where the processes' stderr goes")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--memory", action="store_true", help="measure a node's daemon instead")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.memory:
        from _scale_memory import memory  # noqa: PLC0415

        print(memory())
        return
    sizes = [int(x) for x in args.nodes.split(",")]
    results: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    for run in range(args.runs):
        for n in sizes:
            started = time.monotonic()
            try:
                r = one_run(n, args)
            except Exception as exc:  # one failed run is reported, the rest go on
                print(f"run {run + 1}, {n} nodes: failed: {exc}", file=sys.stderr)
                continue
            results[n].append(r)
            brief = json.dumps({k: v for k, v in r.items() if k != "rest_kinds"})
            print(f"run {run + 1}, {n} nodes ({time.monotonic() - started:.0f} s): {brief}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({str(k): v for k, v in results.items()}, indent=1))
    print(table(results, args))


if __name__ == "__main__":
    main()
