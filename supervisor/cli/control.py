"""Operator commands that talk to a running daemon: status, events, stop, restart.

The daemon is found through the ``daemon.json`` it publishes in its private
run directory (``--pid`` or ``--run-id`` pick one when several run).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import zmq

from supervisor.config.durations import duration
from supervisor.core import checkpoint_interval
from supervisor.log import format_fields
from supervisor.transport.endpoints import running_daemons

EXIT_OK = 0
EXIT_FAILED = 1
NODE_TABLE_TRIES = 10  # a multi-node status asked again, at most, while its node table is read
NODE_TABLE_WAIT = 0.2  # seconds between two asks


class CtlError(RuntimeError):
    pass


def add_commands(sub: Any) -> None:
    for name, summary in (
        ("status", "show the ranks, their sections and heartbeats, and the timeouts in force"),
        ("events", "print the daemon's events (--follow: keep printing them as they happen)"),
        ("stop", "stop the run gracefully, like SIGTERM"),
        ("restart", "end the current generation and start the next (not counted as a failure)"),
    ):
        p = sub.add_parser(name, help=summary, description=summary)
        p.add_argument("--pid", type=int, default=None, help="the daemon's pid")
        p.add_argument("--run-id", default=None, help="the daemon's run id")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument("--timeout", type=duration, default=5.0, help="wait this long for the daemon (5, 30s)")
        if name == "events":
            p.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
        p.set_defaults(handler=_main, command=name)


def _main(ns: argparse.Namespace) -> int:
    try:
        daemon = find_daemon(ns.pid, ns.run_id)
        if ns.command == "events":
            return _events(daemon, ns)
        data = request(daemon, ns.command, ns.timeout)
        if ns.command == "status":
            data = _with_node_table(daemon, data, ns.timeout)
    except CtlError as exc:
        print(f"ft-supervisor {ns.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if ns.json:
        print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
    elif ns.command == "status":
        print(render_status(data))
    else:
        print(f"ft-supervisor {ns.command}: {format_fields(data)}")
    return EXIT_OK


def _with_node_table(daemon: dict[str, Any], data: Any, timeout: float) -> Any:
    """A multi-node daemon reads the job's node table only when asked (each read costs the
    store two requests a node), in the background: the first answer may come before the
    table. Ask again, briefly, until it is there."""
    for _ in range(NODE_TABLE_TRIES):
        job = data.get("job") if isinstance(data, dict) else None
        if not isinstance(job, dict) or job.get("nodes"):
            break
        time.sleep(NODE_TABLE_WAIT)
        data = request(daemon, "status", timeout)
    return data


def find_daemon(pid: int | None, run_id: str | None) -> dict[str, Any]:
    daemons = [
        d
        for d in running_daemons()
        if (pid is None or d.get("pid") == pid) and (run_id is None or d.get("run_id") == run_id)
    ]
    if not daemons:
        raise CtlError("no running ft-supervisor daemon found" + (" matching that" if pid or run_id else ""))
    if len(daemons) > 1:
        listed = ", ".join(f"pid {d['pid']} (run {d.get('run_id')})" for d in daemons)
        raise CtlError(f"several daemons run ({listed}): pick one with --pid or --run-id")
    return daemons[0]


def request(daemon: dict[str, Any], command: str, timeout: float) -> Any:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"ipc://{Path(daemon['dir']) / 'control.sock'}")
        request_id = uuid.uuid4().hex
        sock.send(orjson.dumps({"v": 1, "type": command, "id": request_id}))
        if not sock.poll(int(timeout * 1000)):
            raise CtlError(f"daemon pid {daemon['pid']} did not answer within {timeout:g} s")
        reply = orjson.loads(sock.recv())
    finally:
        sock.close(linger=0)
        ctx.term()
    if not reply.get("ok"):
        raise CtlError(str(reply.get("error")))
    return reply.get("data")


def _events(daemon: dict[str, Any], ns: argparse.Namespace) -> int:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        # subscribe first, then print the log: nothing falls between the two
        sub.connect(f"ipc://{Path(daemon['dir']) / 'events.sock'}")
        last = 0.0
        log = Path(daemon["run_dir"]) / "events.jsonl"
        for line in log.read_bytes().splitlines() if log.exists() else []:
            last = _print_event(line, ns.json, last)
        while ns.follow:
            if sub.poll(1000):
                _, line = sub.recv_multipart()
                last = _print_event(line, ns.json, last)
            elif not _alive(daemon):
                break
    except KeyboardInterrupt:
        pass
    finally:
        sub.close(linger=0)
        ctx.term()
    return EXIT_OK


def _alive(daemon: dict[str, Any]) -> bool:
    return any(d.get("pid") == daemon.get("pid") for d in running_daemons())


def _print_event(line: bytes, as_json: bool, last: float) -> float:
    try:
        event = orjson.loads(line)
        mono = float(event.get("t_mono", 0.0))
    except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
        return last
    if mono <= last:
        return last  # already printed from the log
    if as_json:
        print(line.decode(), flush=True)
    else:
        stamp = time.strftime("%H:%M:%S", time.localtime(event.get("t_wall", 0)))
        fields = {k: v for k, v in event.items() if k not in ("event", "t_wall", "t_mono", "run_id")}
        print(f"{stamp} {event.get('event')} {format_fields(fields)}", flush=True)
    return mono


def _age(seconds: object) -> str:
    return "-" if seconds is None else f"{float(seconds):.1f}s"  # type: ignore[arg-type]


def _timeouts_line(t: dict[str, Any]) -> str:
    """The timeouts in force; a monitored section with none yet says it is being learned."""
    sections = {k: ("learning" if v is None else v) for k, v in (t.get("sections") or {}).items()}
    shown = {
        "initial_heartbeat": t.get("initial_heartbeat"),
        "heartbeat": t.get("heartbeat"),
        "sections": sections or None,
        "out_of_section": t.get("out_of_section"),
    }
    if not any(v is not None for v in shown.values()):
        return "none in force: hangs go unnoticed (set --ft-rank-*-timeout, or have the workload calculate)"
    return format_fields(shown)


def _render_job(job: dict[str, Any]) -> list[str]:
    """Every node of a multi-node job, as each last published itself."""
    lines = [
        f"job: this node is {job.get('node_rank')} of {job.get('nnodes')} "
        f"(rendezvous round {job.get('round')})",
        f"{'NODE':>4} {'HOST':<20} {'PID':>8} {'STATE':<10} {'GEN':>4} {'RANKS':>5} {'UPDATED':>8}",
    ]
    now = time.time()
    for n in sorted(
        job.get("nodes") or [], key=lambda n: (n.get("node_rank") is None, n.get("node_rank") or 0)
    ):
        rank = "-" if n.get("node_rank") is None else str(n["node_rank"])
        gen = "-" if n.get("generation") is None else str(n["generation"])
        updated = n.get("updated")
        age = "-" if updated is None else _age(now - float(updated))
        lines.append(
            f"{rank:>4} {str(n.get('host', '?'))[:20]:<20} {n.get('pid', '-')!s:>8} "
            f"{n.get('state', '?')!s:<10} {gen:>4} {n.get('ranks', '-')!s:>5} {age:>8}"
        )
    return lines


def _containment_line(c: dict[str, Any] | None) -> str:
    """Which guarantee holds the ranks' descendants (README: process containment)."""
    if not c:
        return "containment: -"
    if c.get("mode") == "cgroup":
        return f"containment: cgroup {c.get('cgroup')} (ended with {c.get('kill')})"
    return f"containment: fallback: process groups, PDEATHSIG, token sweep ({c.get('why')})"


def _slowness(row: dict[str, Any]) -> str:
    """The rank's straggler score (its own work per step over the node's typical rank);
    ``!`` once it is flagged as a straggler."""
    score = row.get("straggler_score")
    if not isinstance(score, int | float):
        return "-"
    return f"{score:.2f}" + ("!" if row.get("straggler") else "")


def render_status(s: dict[str, Any]) -> str:
    lines = [
        f"run {s['run_id']}  pid {s['pid']}  generation {s['generation']}  "
        f"restarts {s['restarts_used']}/{s['max_restarts']}  up {s['uptime_s']:.0f}s",
        f"{'RANK':>4} {'LOCAL':>5} {'PID':>8} {'STATE':<10} {'ITER':>7} "
        f"{'SECTIONS (open for)':<28} {'HEARTBEAT':>9} {'SLOW':>6}",
    ]
    for r in s["ranks"]:
        sections = ", ".join(f"{n} {_age(a)}" for n, a in (r.get("sections") or {}).items()) or "-"
        iteration = "-" if r.get("iteration") is None else str(r["iteration"])
        lines.append(
            f"{r['rank']:>4} {r['local_rank']:>5} {r['pid']:>8} {r['state']:<10} {iteration:>7} "
            f"{sections:<28} {_age(r.get('heartbeat_age')):>9} {_slowness(r):>6}"
        )
    t = s.get("timeouts") or {}
    learned = t.get("learned") or {}
    lines.append("timeouts: " + _timeouts_line(t))
    if any(v for v in learned.values()):
        lines.append("learned:  " + format_fields({k: v for k, v in learned.items() if v}))
    if "containment" in s:
        lines.append(_containment_line(s["containment"]))
    if s.get("standby"):
        sb = s["standby"]
        state = f"ready after {sb.get('seconds')} s" if sb.get("ready") else "preloading"
        lines.append(f"standby:  generation {sb.get('generation')}, {sb.get('ranks')} ranks, {state}"
                     + (f" ({sb['priority']} priority)" if sb.get("priority") else ""))
    if s.get("checkpoint_interval"):
        lines.append(checkpoint_interval.describe(s["checkpoint_interval"]))
    if s.get("dropped"):
        lines.append("dropped messages: " + format_fields(s["dropped"]))
    for lookup in s.get("reverse_dns_slow") or ():  # every torch store connection waits as long
        lines.append(f"reverse DNS: {lookup.get('address')} took {lookup.get('seconds')} s "
                     f"({lookup.get('outcome')})")  # fmt: skip
    if s.get("job"):
        lines += _render_job(s["job"])
    lines.append(f"run dir: {s['run_dir']}")
    return "\n".join(lines)
