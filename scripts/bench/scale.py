"""What the job-wide agreement costs at N nodes: many simulated nodes, one real TCPStore.

How to run (from the repository root, in the project's virtualenv)::

    .venv/bin/python scripts/bench/scale.py                         # N = 16, 64, 128; ~1 min
    .venv/bin/python scripts/bench/scale.py --nodes 256 --keep-alive 5 --rest 15   # torch's 5 s
    .venv/bin/python scripts/bench/scale.py --nodes 1024 --join-rate 40 --keep-alive 60 --rest 65
    .venv/bin/python scripts/bench/scale.py --memory                # a node's daemon: RSS/PSS, start-up

Method
------
A "node" is one ``supervisor.coord.job.RendezvousJob``, the object a daemon
drives: the real rendezvous (torch's dynamic rendezvous on the c10d backend, its
keep-alive thread, our watch and agreement), without ranks. The nodes live in
processes of ``NODES_PER_PROCESS`` (``--procs``), each node with its own TCPStore
clients, against one real torch TCPStore hosted by a process of its own (so that
its CPU is its own). torch's TCPStore counts nothing, so every node reaches it
through a counting TCP proxy (``_store_proxy.py``, a third process): a request is a
burst of bytes from a client after the store last answered on that connection, its
type the first byte.

One run, for one ``N``:

1. the nodes reach the store and join one rendezvous round (``--nnodes N:N``),
   ``--join-rate`` a second: torch's join rewrites the whole state by
   compare-and-set and retries at once on a conflict, so N nodes joining at once
   are N contending writers (at 1,024 nodes, each attempt costing milliseconds of
   a shared CPU here, the round never filled);
2. once every node's wait connections are open, at rest: every node watches its
   peers (``RendezvousJob.watch``) as a daemon does while its ranks run; after
   ``--settle`` s, the store requests, the store's CPU and the nodes' CPU are
   counted over ``--rest`` s (make it longer than ``--keep-alive`` to count every
   node's keep-alive);
3. a failure: one node announces that its generation ended (``announce_end``, as
   the daemon does when a rank fails) and publishes a failed outcome (``agree``);
   each other node, as soon as its watch returns, publishes its outcome (it
   follows) and waits for the round's decision. "learn" is the time from the
   announcement until every node's listening thread has heard ``ended`` from the
   store; "hear the decision" until every node's has heard ``decided`` (every
   node's outcome is in, gathered once). "every node through" is when the last
   node's coroutine, having read and checked every outcome, got its turn in its
   process's loop: hundreds of nodes share two cores here, so that one is an upper
   bound, and "a node's CPU for the failure" is what each node spends (a real node
   spends it on a CPU of its own). Each node applies ``core.jobwide.joint``: all
   must reach the same decision (checked). A line under the table splits the time
   to the decision: every node's coroutine resumed (its watch heard and its loop
   gave it a turn), the last place claimed, the outcomes written (``decided``).

Made to fit one machine, not measured: nodes waiting for the round look at torch's
state every ``max(JOIN_POLL, N / 64)`` s, without our quickened start of a round;
torch's name for each rendezvous event comes from ``sys._getframe`` instead of
``inspect.stack()`` (``_lighten_torch_records``); and the harness runs in a mount
namespace whose /etc/hosts names the loopback forms (``_with_loopback_names``):
this machine's reverse DNS stalls torch's store host for 5 s per connection.

torch's keep-alive is its own: every ``keep_alive_interval`` each node rewrites the
whole rendezvous state by compare-and-set. torch starts every node's timer when the
round completes, so the whole job wrote at once (``supervisor/coord/keepalive.py``
now starts each node's at a random phase). The table counts the keep-alives that
failed (past their deadline, ``heartbeat_timeout``: torch's fixed 5 s until the daemon
made it half the keep-alive interval) at rest and in the whole run: the failure
round saturates this machine's two cores with N nodes' work, and a keep-alive
thread that waits past its deadline for a core fails there, not in a real job.

The nodes' CPU at rest, divided by ``N``, is a node's daemon CPU for the rendezvous,
torch's keep-alive thread included. Runs of different ``N`` are interleaved;
medians of ``--runs``. ``FT_SCALE_TRACE=1`` logs every state read, compare-and-set
and back-off after a lost write (time, seconds, success or what, thread name:ident, which
tells one node's keep-alive thread from another's) to /tmp/ft-scale-cas.PID.
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
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import CLK_TCK, fmt, median, read_stat

HERE = Path(__file__).resolve().parent
JOIN_POLL = 1.0  # s between looks of a node waiting for the round to fill (torch: 1)
NODES_PER_PROCESS = 128
CONNECTS = 32  # nodes of a process reaching the store at once
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


def _lighten_torch_records() -> None:
    """torch names the calling method of each rendezvous event with ``inspect.stack()``,
    which reads every frame's source file: milliseconds per event. Each real node pays
    that on its own CPU; hundreds of nodes in one process would queue on it under the
    GIL (at 256 nodes most of the join went there). Same name, found without the
    source: only the harness does this."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn  # noqa: PLC0415

    def method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name
        except ValueError:
            return "no_method_name"

    dyn.get_method_name = method_name  # type: ignore[attr-defined]


def _trace_compare_sets() -> None:
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as cb  # noqa: PLC0415

    real = cb.C10dRendezvousBackend.set_state
    out = open(f"/tmp/ft-scale-cas.{os.getpid()}", "w")  # noqa: SIM115

    def traced(self: Any, state: bytes, token: Any = None) -> Any:
        t0 = time.monotonic()
        got = real(self, state, token)
        out.write(f"{t0:.3f} {time.monotonic() - t0:.4f} {bool(got and got[2])} {_who()}\n")
        out.flush()
        return got

    cb.C10dRendezvousBackend.set_state = traced
    real_get = cb.C10dRendezvousBackend.get_state

    def traced_get(self: Any) -> Any:
        t0 = time.monotonic()
        got = real_get(self)
        out.write(f"{t0:.3f} {time.monotonic() - t0:.4f} get {_who()}\n")
        out.flush()
        return got

    cb.C10dRendezvousBackend.get_state = traced_get
    with contextlib.suppress(ImportError):  # a tree without the back-off (before/after runs)
        from supervisor.coord import pace  # noqa: PLC0415

        back_off = pace.Window.back_off

        def traced_back_off(self: Any, *args: Any, **kwargs: Any) -> None:
            t0 = time.monotonic()
            back_off(self, *args, **kwargs)
            out.write(
                f"{t0:.3f} {time.monotonic() - t0:.4f} backoff {_who()} {getattr(self, 'losses', args)}\n"
            )
            out.flush()

        pace.Window.back_off = traced_back_off  # type: ignore[method-assign]


def _who() -> str:
    """A trace line's thread: its name (what it does) and ident (which node's it is)."""
    me = threading.current_thread()
    return f"{me.name}:{me.ident}"


def _time_news() -> dict[str, list[float]]:
    """When each node's listening thread heard the end of the generation (``ended``)
    and the round's decision (``decided``) from the store, apart from when its
    coroutine got its turn in this process's loop to go on (hundreds of nodes share
    two cores here, and the first to hear start agreeing while the others wait for
    their turn; a real node does that on a CPU of its own)."""
    from supervisor.coord import rounds  # noqa: PLC0415

    heard: dict[str, list[float]] = {"ended": [], "decided": [], "claimed": [], "gathered": []}
    listen, claim, gather = rounds.listen, rounds.claim, rounds.gather

    def timed_claim(joined: Any, n: int, outcome: Any) -> None:  # a node's place, once its requests are done
        claim(joined, n, outcome)
        heard["claimed"].append(time.monotonic())

    def timed_gather(joined: Any, n: int) -> None:  # "decided" written: the round's outcomes published
        gather(joined, n)
        heard["gathered"].append(time.monotonic())

    def timed(joined: Any, which: int, key: str, wake: threading.Event, name: str) -> list[Exception | None]:
        got = listen(joined, which, key, wake, name)

        def note() -> None:
            wake.wait()
            if got and got[0] is None:
                heard[key].append(time.monotonic())

        threading.Thread(target=note, daemon=True).start()
        return got

    rounds.listen, rounds.claim, rounds.gather = timed, timed_claim, timed_gather
    return heard


def _say_why_lost() -> None:
    """A node that finds peers lost at rest prints what it read (round, members,
    participants, the heartbeats' ages), once: a false loss names its cause."""
    from supervisor.coord import rounds  # noqa: PLC0415

    news, said = rounds.news, []

    def told(snap: Any, joined: Any, bound: float, clock: Any = None) -> Any:
        found = news(snap, joined, bound) if clock is None else news(snap, joined, bound, clock)
        if found is not None and not said:
            said.append(True)
            now = time.time()
            others = {r: who for r, who in joined.members.items() if who != joined.me}
            ages = sorted(now - snap.heartbeats[w] for w in others.values() if w in snap.heartbeats)
            absent = sum(1 for w in others.values() if w not in snap.participants)
            sample = [round(a, 1) for a in ages[:: max(1, len(ages) // 8)]]
            print(f"[why] {joined.me} round {snap.round}/{joined.round} complete={snap.complete} "
                  f"participants {len(snap.participants)} heartbeats {len(snap.heartbeats)} "
                  f"members {len(joined.members)} absent {absent} ages "
                  f"{sample} max {ages[-1] if ages else None}",
                  file=sys.stderr, flush=True)  # fmt: skip
        return found

    rounds.news = told


def _line(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


async def _nodes(args: argparse.Namespace) -> dict[str, Any]:
    from supervisor.config.rendezvous import RdzvConfig  # noqa: PLC0415
    from supervisor.coord import torchrdzv  # noqa: PLC0415
    from supervisor.coord.job import RendezvousJob  # noqa: PLC0415
    from supervisor.coord.pace import Pace  # noqa: PLC0415
    from supervisor.core.jobwide import NodeOutcome, joint  # noqa: PLC0415
    from supervisor.core.types import Action, Reason  # noqa: PLC0415

    n, here = args.total, args.child
    if not args.port:  # started before the store: its proxy's port comes once both are up
        args.port = int(await asyncio.to_thread(sys.stdin.readline))
    conf = {"is_host": "0", "keep_alive_interval": str(args.keep_alive), "keep_alive_max_attempt": "3",
            "join_timeout": "900", "last_call_timeout": "1"}  # fmt: skip
    cfg = RdzvConfig("c10d", f"127.0.0.1:{args.port}", "scale", n, n, local_addr="127.0.0.1", conf=conf)
    _lighten_torch_records()
    if os.environ.get("FT_SCALE_TRACE"):
        _trace_compare_sets()
    # Not measured, only made to fit one machine: while the round fills, each node
    # looks at torch's state every second (its size grows with N), N^2 reads of it in
    # all. Here nodes waiting for the round look every JOIN_POLL s instead.
    looks = max(JOIN_POLL, n / 64)  # N / 256 at 1,024 nodes: 200 reads a second of a 270 KB state
    torchrdzv.PACE = Pace(window=float("inf"), fast=looks, slowest=looks)
    heard = _time_news()
    _say_why_lost()
    jobs = [RendezvousJob(cfg, 30000 + args.offset + i, _Quiet()) for i in range(here)]
    missed = _KeepAliveMisses()
    logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous").addHandler(missed)
    t0 = time.monotonic()
    for i in range(0, here, CONNECTS):  # each in a thread of its own; some connects take 5 s here
        await asyncio.gather(*(j.start() for j in jobs[i : i + CONNECTS]))
    print(f"[{args.offset}] {here} nodes reached the store in {time.monotonic() - t0:.1f} s", file=sys.stderr,
          flush=True)  # fmt: skip
    joins = []
    for j in jobs:
        joins.append(asyncio.ensure_future(j.join(0)))
        await asyncio.sleep(args.join_gap)
    gens = await asyncio.gather(*joins)
    joined_s = time.monotonic() - t0
    print(f"[{args.offset}] {here} nodes joined in {joined_s:.1f} s", file=sys.stderr, flush=True)
    pairs = list(zip(jobs, gens, strict=True))

    # each node opens its round's wait connections in the background; the job is at
    # rest once they are open
    opened = time.monotonic()
    listeners = [getattr(g.joined, "listeners", None) for g in gens]  # None: the old protocol
    while not all(lis is None or lis.ready() for lis in listeners):
        await asyncio.sleep(0.1)
        if time.monotonic() - opened > 300:
            break
    opened_s = time.monotonic() - opened
    watches = [asyncio.ensure_future(j.watch(g)) for j, g in pairs]
    _line({"phase": "ready", "joined_s": joined_s, "opened_s": opened_s})
    command = await asyncio.to_thread(sys.stdin.readline)  # "mark" or "fail", after the rest counted
    missed_at_rest = missed.count

    early = [w for w in watches if w.done()]  # news before the failure: a false alarm
    if early:
        news = early[0].exception() or early[0].result()
        print(f"[{args.offset}] {len(early)} node(s) heard news at rest: {news}", file=sys.stderr, flush=True)
    learned: list[float] = []
    agreed: list[float] = []
    decisions: list[Action] = []

    async def follower(k: int) -> None:
        job, gen = pairs[k]
        _news, detail = await watches[k]
        learned.append(time.monotonic())
        own = NodeOutcome(gen.node_rank, Action.RESTART, Reason.PEER_FAILED, detail)
        outcomes = await job.agree(gen, own)
        agreed.append(time.monotonic())
        decisions.append(joint(own, outcomes) if len(outcomes) == n else Action.ABORT)

    async def failing() -> None:
        job, gen = pairs[0]
        watches[0].cancel()
        await job.announce_end(gen, "generation 0 failed")
        own = NodeOutcome(gen.node_rank, Action.RESTART, Reason.RANK_FAILED, "rank 0 raised")
        outcomes = await job.agree(gen, own)
        agreed.append(time.monotonic())
        decisions.append(joint(own, outcomes) if len(outcomes) == n else Action.ABORT)

    fails = command.strip() == "fail"
    if not fails:
        _line({"phase": "marked"})
    t_fail = time.monotonic()
    tasks = [follower(k) for k in range(1 if fails else 0, here)]
    through = True
    try:
        await asyncio.wait_for(asyncio.gather(*([failing()] if fails else []), *tasks), 300)
    except TimeoutError:  # where the round stalled: which of this process's nodes got how far
        through = False
        print(f"[{args.offset}] the failure round past 300 s: of {here} nodes {len(learned)} learned of it, "
              f"{len(agreed)} agreed; heard 'ended' {len(heard['ended'])}, "
              f"'decided' {len(heard['decided'])}; "
              f"outcomes published in the job {gens[0].joined.store.add('published', 0)} of {n}",
              file=sys.stderr, flush=True)  # fmt: skip
    return {
        "nodes": here,
        "joined_s": joined_s,
        "t_fail": t_fail if fails else None,
        "learned": max(learned, default=None),
        "agreed": max(agreed, default=None) if through else None,
        "through": len(agreed),  # nodes whose coroutine took the decision in (of "nodes")
        "heard_end": max(heard["ended"], default=None),
        "heard": max(heard["decided"], default=None),
        "claimed": max(heard["claimed"], default=None),
        "gathered": min(heard["gathered"], default=None),
        "same_decision": set(decisions) == {Action.RESTART} and len(decisions) == here,
        "keep_alive_missed": missed.count,
        "keep_alive_missed_rest": missed_at_rest,
        "listeners_open_s": opened_s,
        "news_at_rest": len(early),
    }


def child(args: argparse.Namespace) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where the nodes are: kill -USR1
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    _line(asyncio.run(_nodes(args)))
    sys.stdout.flush()
    os._exit(0)  # thousands of rendezvous threads: no orderly teardown needed


# -- one run (parent) ----------------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    st = read_stat(pid)
    return 0.0 if st is None else st.cpu_ticks / CLK_TCK


def _slices(n: int, procs: int) -> list[int]:
    return [n // procs + (1 if i < n % procs else 0) for i in range(procs)]


def one_run(n: int, args: argparse.Namespace) -> dict[str, Any]:
    py = sys.executable
    code = os.environ.get("PYTHONPATH") or str(HERE.parents[1])  # another tree's code: before/after
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONPATH": code}
    procs: list[subprocess.Popen[str]] = []
    err = open(args.stderr, "a")  # noqa: SIM115 - closed below
    try:
        # the nodes' processes first: they import torch while the store's host does (they
        # read the proxy's port once it is up); nothing is counted before every node joined
        parts = _slices(n, args.procs or max(1, -(-n // NODES_PER_PROCESS)))
        children: list[subprocess.Popen[str]] = []
        offset = 0
        for here in parts:
            children.append(subprocess.Popen(
                [py, __file__, "--child", str(here), "--total", str(n), "--offset", str(offset),
                 "--port", "0", "--keep-alive", str(args.keep_alive),
                 "--join-gap", str(len(parts) / args.join_rate)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
            ))  # fmt: skip
            offset += here
        procs.extend(children)
        store = subprocess.Popen([py, "-c", STORE_HOST], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=err, text=True, env=env)  # fmt: skip
        procs.insert(0, store)
        assert store.stdout is not None
        store_port = int(store.stdout.readline())
        proxy = subprocess.Popen([py, str(HERE / "_store_proxy.py"), str(store_port)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=err, text=True, env=env)  # fmt: skip
        procs.insert(1, proxy)
        assert proxy.stdout is not None and proxy.stdin is not None
        port = int(proxy.stdout.readline())

        def counts() -> dict[str, Any]:
            assert proxy.stdin is not None and proxy.stdout is not None
            proxy.stdin.write("\n")
            proxy.stdin.flush()
            got: dict[str, Any] = json.loads(proxy.stdout.readline())
            return got

        def read(c: subprocess.Popen[str]) -> dict[str, Any]:
            assert c.stdout is not None
            line = c.stdout.readline()
            if not line:
                raise RuntimeError(f"{n} nodes: a nodes' process died (see {args.stderr})")
            got: dict[str, Any] = json.loads(line)
            return got

        def say(c: subprocess.Popen[str], what: str) -> None:
            assert c.stdin is not None
            c.stdin.write(what + "\n")
            c.stdin.flush()

        for c in children:
            say(c, str(port))
        ready = [read(c) for c in children]  # every node joined, its wait connections open
        time.sleep(args.settle)
        pids = [store.pid] + [c.pid for c in children]
        c0, cpu0, t0 = counts(), [_cpu_s(p) for p in pids], time.monotonic()
        time.sleep(args.rest)
        c1, cpu1, t1 = counts(), [_cpu_s(p) for p in pids], time.monotonic()
        for c in children[1:]:  # the followers note any news heard at rest, then the failure
            say(c, "mark")
        for c in children[1:]:
            read(c)
        cpu2 = [_cpu_s(c.pid) for c in children]
        say(children[0], "fail")
        results = [read(c) for c in children]
        failure_cpu = sum(_cpu_s(c.pid) for c in children) - sum(cpu2)
        c2 = counts()
        span = t1 - t0
        reqs0, reqs1, reqs2 = (sum(c["requests"].values()) for c in (c0, c1, c2))
        kinds = {k: (v - c0["requests"].get(k, 0)) / span for k, v in c1["requests"].items()}
        t_fail = results[0]["t_fail"]
        return {
            "n": n,
            "processes": len(children),
            "joined_s": max(r["joined_s"] for r in ready),
            "listeners_open_s": max(r["opened_s"] for r in ready),
            "nodes_cpu_rest": sum(b - a for a, b in zip(cpu0[1:], cpu1[1:], strict=True)) / span,
            "learn_s": max(r["heard_end"] for r in results if r["heard_end"] is not None) - t_fail,
            "resumed_s": max(r["learned"] for r in results if r["learned"] is not None) - t_fail,
            # None where some node was not through within the round's 300 s: how many were
            "agree_s": None
            if any(r["agreed"] is None for r in results)
            else max(r["agreed"] for r in results) - t_fail,
            "through": sum(r["through"] for r in results),
            "heard_s": max(r["heard"] for r in results if r["heard"] is not None) - t_fail,
            # where the time to the decision goes: the last node's place claimed, "decided" written
            "claimed_s": max(r["claimed"] for r in results if r["claimed"] is not None) - t_fail,
            "gathered_s": min(r["gathered"] for r in results if r["gathered"] is not None) - t_fail,
            "same_decision": all(r["same_decision"] for r in results),
            "keep_alive_missed": sum(r["keep_alive_missed"] for r in results),
            "keep_alive_missed_rest": sum(r["keep_alive_missed_rest"] for r in results),
            "news_at_rest": sum(r["news_at_rest"] for r in results),
            "rest_rps": (reqs1 - reqs0) / span,
            "rest_kinds": {
                k: round(v, 1) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v >= 0.05
            },
            "rest_mbps": (c1["down"] + c1["up"] - c0["down"] - c0["up"]) / span / 1e6,
            "store_cpu": (cpu1[0] - cpu0[0]) / span,
            "failure_requests": reqs2 - reqs1,
            "failure_cpu_per_node_s": failure_cpu / n,
        }
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(10)
        err.close()


def table(results: dict[int, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    rows = [
        "| nodes | store requests/s at rest | store MB/s at rest | all learn s | all hear the decision s "
        "| every node through (harness) s | a node's CPU for the failure ms "
        "| requests per failure | store CPU at rest | per-node CPU at rest | join s "
        "| keep-alives failed at rest / in all |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, runs in sorted(results.items()):
        ok = [r for r in runs if r.get("same_decision")]
        keys = ("rest_rps", "rest_mbps", "learn_s", "heard_s", "agree_s", "failure_requests", "store_cpu",
                "nodes_cpu_rest", "joined_s", "failure_cpu_per_node_s")  # fmt: skip
        med = {k: median(r.get(k) for r in runs) for k in keys}
        per_node = None if med["nodes_cpu_rest"] is None else med["nodes_cpu_rest"] / n
        if any(r.get("agree_s") is None for r in runs):  # some node not through in 300 s
            through = ", ".join(f"{r.get('through')}" for r in runs)
            agree = f"past 300 s ({through} of {n} through)"
        else:
            agree = fmt(med["agree_s"]) + (
                "" if len(ok) == len(runs) else f" ({len(runs) - len(ok)} disagreed)"
            )
        rows.append(
            f"| {n} | {fmt(med['rest_rps'], 0)} | {fmt(med['rest_mbps'], 2)} | {fmt(med['learn_s'])} "
            f"| {fmt(med['heard_s'])} "
            f"| {agree} | {fmt(1000 * (med['failure_cpu_per_node_s'] or 0), 1)} "
            f"| {fmt(med['failure_requests'], 0)} | {fmt(100 * (med['store_cpu'] or 0), 1)} % "
            f"| {fmt(100 * (per_node or 0), 3)} % | {fmt(med['joined_s'], 1)} "
            f"| {fmt(median(r.get('keep_alive_missed_rest') for r in runs), 0)} "
            f"/ {fmt(median(r['keep_alive_missed'] for r in runs), 0)} |"
        )
    kinds = {n: runs[-1]["rest_kinds"] for n, runs in sorted(results.items()) if runs}
    rows.append("")
    for n, runs in sorted(results.items()):  # the decision's time, stage by stage (medians)
        stages = {k: median(r.get(k) for r in runs) for k in ("resumed_s", "claimed_s", "gathered_s")}
        rows.append(
            f"{n} nodes, after the failure: every node's coroutine resumed {fmt(stages['resumed_s'])} s, "
            f"the last place claimed {fmt(stages['claimed_s'])} s, the outcomes written (decided) "
            f"{fmt(stages['gathered_s'])} s"
        )
    rows.append(f"requests/s at rest by kind (last run): {json.dumps(kinds)}")
    rows.append(f"keep_alive_interval={args.keep_alive} s, {args.rest} s at rest after {args.settle} s, "
                f"medians of {args.runs} run(s); CPU in % of one core")  # fmt: skip
    return "\n".join(rows)


LOOPBACK_HOSTS = "127.0.0.1 localhost\n::ffff:127.0.0.1 localhost\n::1 localhost\n"


def _with_loopback_names(argv: list[str]) -> None:
    """Re-run this harness where every loopback form has a name in /etc/hosts.

    torch's c10d socket code names each peer with ``getnameinfo``; the store listens
    on ``[::]``, so a client on 127.0.0.1 is ``::ffff:127.0.0.1``, which this machine's
    /etc/hosts lacks: the lookup goes to a DNS server that sometimes never answers
    (5 s), and the store's host stops serving every client meanwhile (seen here:
    a ``get`` on an open connection took 10 s while 512 others connected). That is
    this machine's resolver, not the protocol measured, so the harness runs in a
    mount namespace of its own with a hosts file that names them (root and
    ``unshare`` needed; ``--real-dns`` keeps the machine's). docs/guides/multi-node.md says how a
    cluster with slow reverse DNS hits the same stall."""
    hosts = Path(os.environ.get("TMPDIR", "/tmp")) / f"ft-scale-hosts.{os.getpid()}"
    hosts.write_text(LOOPBACK_HOSTS)
    # unshare and sh exec: the same pid goes on; a mount refused leaves the machine's names
    script = 'mount --bind "$0" /etc/hosts || echo "scale.py: /etc/hosts kept" >&2; exec "$@"'
    os.environ["FT_SCALE_HOSTS"] = str(hosts)  # the harness removes it once mounted
    os.execvp("unshare", ["unshare", "--mount", "sh", "-c", script, str(hosts), sys.executable, *argv])


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
    parser.add_argument(
        "--procs",
        type=int,
        default=0,
        help=f"processes the nodes live in (default: one per {NODES_PER_PROCESS} nodes)",
    )
    parser.add_argument("--join-rate", type=float, default=200.0, help="nodes starting their join a second")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--total", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--join-gap", type=float, default=0.005, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--real-dns", action="store_true", help="keep this machine's /etc/hosts (see Method)")
    args = parser.parse_args()
    if os.environ.get("FT_SCALE_HOSTS") and not args.child:
        Path(os.environ["FT_SCALE_HOSTS"]).unlink(missing_ok=True)  # mounted: the mount keeps it
    elif not (args.child or args.memory or args.real_dns):
        if os.geteuid() == 0 and shutil.which("unshare"):
            may = subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False)
            if may.returncode == 0:
                _with_loopback_names(sys.argv)
        print("not root or no unshare: this machine's /etc/hosts is kept (see Method)", file=sys.stderr)
    if args.child:
        child(args)
        return
    if args.memory:
        from _scale_memory import memory  # noqa: PLC0415

        print(memory())
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the runs' finally ends their processes
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
