"""Operator commands that talk to a running daemon: status, events, stop, restart.

The daemon is found through the ``daemon.json`` it publishes in its private
run directory. ``--pid`` or ``--run-id`` name one; without them a command acts on
the one daemon of this environment (this pid namespace, and this ``--log-dir`` or
working directory), never on another job's of the same user: where that is not
exactly one, it lists the candidates and exits 2. ``status`` and ``events``, which
change nothing, also take the user's only daemon when none runs here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import zmq

from supervisor.clock import SYSTEM
from supervisor.config.durations import duration
from supervisor.core import checkpoint_interval
from supervisor.core.catalogue import NotAnEvent, decode
from supervisor.log import format_fields
from supervisor.log.human import sentence, timeouts_text
from supervisor.transport.endpoints import pid_namespace, running_daemons

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_AMBIGUOUS = 2  # no target named, and not exactly one daemon in this environment
DEFAULT_LOG_DIR = "ft-supervisor-logs"  # run's default (supervisor.config.build)
NODE_TABLE_TRIES = 10  # a multi-node status asked again, at most, while its node table is read
NODE_TABLE_WAIT = 0.2  # seconds between two asks


class CtlError(RuntimeError):
    pass


class Ambiguous(CtlError):
    """No daemon named, and not exactly one in this environment: the candidates."""

    def __init__(self, message: str, candidates: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.candidates = candidates


def _real(path: object) -> str | None:
    return os.path.realpath(path) if isinstance(path, str) and path else None


@dataclass(frozen=True, slots=True)
class Place:
    """Where a command runs; a daemon that runs here is the one it acts on unasked."""

    pidns: str | None
    cwd: str
    log_dir: str

    @classmethod
    def current(cls, log_dir: str | None) -> Place:
        # the log dir run would use here: --log-dir, torchrun's variable, else its default
        chosen = log_dir or os.environ.get("PET_LOG_DIR") or DEFAULT_LOG_DIR
        return cls(pid_namespace(), str(Path.cwd().resolve()), os.path.realpath(chosen))

    def holds(self, daemon: dict[str, Any]) -> bool:
        if self.pidns is None or daemon.get("pidns") != self.pidns:
            return False  # a daemon.json without it (an older daemon) is not known to be here
        return _real(daemon.get("log_dir")) == self.log_dir or _real(daemon.get("cwd")) == self.cwd

    def describe(self) -> str:
        return f"pid namespace {self.pidns}, log dir {self.log_dir} or working directory {self.cwd}"


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
        p.add_argument("--log-dir", default=None,
                       help="the run's --log-dir: a daemon writing there is this environment's "
                            "(default ./ft-supervisor-logs; a daemon started here is too)")  # fmt: skip
        if name == "events":
            p.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
        p.set_defaults(handler=_main, command=name)


def _main(ns: argparse.Namespace) -> int:
    try:
        daemon = find_daemon(ns.pid, ns.run_id, Place.current(ns.log_dir),
                             read_only=ns.command in ("status", "events"))  # fmt: skip
        if ns.command == "events":
            return _events(daemon, ns)
        data = request(daemon, ns.command, ns.timeout)
        if ns.command == "status":
            data = _with_node_table(daemon, data, ns.timeout)
    except Ambiguous as exc:
        if ns.json:
            print(orjson.dumps({"error": str(exc), "candidates": [_identity(d) for d in exc.candidates]},
                               option=orjson.OPT_INDENT_2).decode())  # fmt: skip
        print(f"ft-supervisor {ns.command}: {exc}", file=sys.stderr)
        for line in candidate_lines(exc.candidates):
            print(f"  {line}", file=sys.stderr)
        return EXIT_AMBIGUOUS
    except CtlError as exc:
        print(f"ft-supervisor {ns.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if ns.command != "status":  # status names its daemon itself
        data = {**_identity(daemon), **(data if isinstance(data, dict) else {"reply": data})}
    if ns.json:
        print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
    elif ns.command == "status":
        print(render_status(data))
    else:
        print(f"ft-supervisor {ns.command}: {acted(ns.command, data)}")
    return EXIT_OK


def _identity(d: dict[str, Any]) -> dict[str, Any]:
    """What names a daemon to its operator, from the daemon.json it published."""
    return {"run_id": d.get("run_id"), "pid": d.get("pid"), "run_dir": d.get("run_dir"),
            "cwd": d.get("cwd"), "log_dir": d.get("log_dir")}  # fmt: skip


def acted(command: str, data: dict[str, Any]) -> str:
    """The line that says what was done, and to which run."""
    target = f"run {data.get('run_id')}  pid {data.get('pid')}  run dir {data.get('run_dir')}"
    if command == "stop":
        return f"stopping {target}"
    if command == "restart" and "restarting" in data:
        return f"restarting (generation {data['restarting']} ends) {target}"
    rest = {k: v for k, v in data.items() if k not in ("run_id", "pid", "run_dir", "cwd", "log_dir")}
    return f"{target}  {format_fields(rest)}"


def candidate_lines(daemons: list[dict[str, Any]]) -> list[str]:
    own = pid_namespace()
    lines = []
    for d in sorted(daemons, key=lambda d: (str(d.get("run_id")), int(d.get("pid") or 0))):
        line = f"run {d.get('run_id')}  pid {d.get('pid')}  run dir {d.get('run_dir')}  cwd {d.get('cwd')}"
        if d.get("pidns") not in (None, own):
            line += f"  (another pid namespace: {d.get('pidns')})"
        lines.append(line)
    return lines


def _with_node_table(daemon: dict[str, Any], data: Any, timeout: float) -> Any:
    """A multi-node daemon reads the job's node table only when asked (each read costs the
    store two requests a node), in the background: the first answer may come before the
    table. Ask again, briefly, until it is there."""
    for _ in range(NODE_TABLE_TRIES):
        job = data.get("job") if isinstance(data, dict) else None
        if not isinstance(job, dict) or job.get("nodes"):
            break
        SYSTEM.pause(NODE_TABLE_WAIT)
        data = request(daemon, "status", timeout)
    return data


def find_daemon(
    pid: int | None, run_id: str | None, here: Place | None = None, *, read_only: bool = True
) -> dict[str, Any]:
    """The daemon a command acts on: the one named, else the one of this environment."""
    return choose(running_daemons(), pid, run_id, here or Place.current(None), read_only=read_only)


def choose(
    daemons: list[dict[str, Any]], pid: int | None, run_id: str | None, here: Place, *, read_only: bool
) -> dict[str, Any]:
    if pid is not None or run_id is not None:
        # a pid names a process of this pid namespace only
        named = [d for d in daemons
                 if (pid is None or (d.get("pid") == pid and d.get("pidns") in (None, here.pidns)))
                 and (run_id is None or d.get("run_id") == run_id)]  # fmt: skip
        if not named:
            raise CtlError("no running ft-supervisor daemon matching that")
        if len(named) > 1:
            raise Ambiguous(f"{len(named)} daemons match that: name one with --pid", named)
        return named[0]
    if not daemons:
        raise CtlError("no running ft-supervisor daemon found")
    local = [d for d in daemons if here.holds(d)]
    if len(local) == 1:
        return local[0]
    if not local and read_only and len(daemons) == 1:
        return daemons[0]  # reading the user's only daemon changes nothing
    if local:
        raise Ambiguous(f"{len(local)} daemons run in this environment ({here.describe()}): "
                        "name one with --pid or --run-id", local)  # fmt: skip
    raise Ambiguous(f"no daemon runs in this environment ({here.describe()}), {len(daemons)} of this "
                    "user's run elsewhere: name one with --pid or --run-id", daemons)  # fmt: skip


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
        return mono
    try:
        # through the catalogue: an older daemon's fields print under today's names
        record = decode(event).as_dict(defaults=False)
    except NotAnEvent:
        record = event  # no event name: printed as it is, as before
    stamp = time.strftime("%H:%M:%S", time.localtime(event.get("t_wall", 0)))
    fields = {k: v for k, v in record.items() if k not in ("event", "t_wall", "t_mono", "run_id")}
    said = sentence(str(event.get("event")), fields)
    print(f"{stamp} {event.get('event')}: " + "\n    ".join(said), flush=True)
    return mono


def _age(seconds: object) -> str:
    return "-" if seconds is None else f"{float(seconds):.1f}s"  # type: ignore[arg-type]


def _timeouts_line(t: dict[str, Any]) -> str:
    """The timeouts in force; a monitored section with none yet says it is being learned."""
    if not any(t.get(k) for k in ("initial_heartbeat", "heartbeat", "sections", "out_of_section")):
        return "none in force: hangs go unnoticed (set --ft-rank-*-timeout, or have the workload calculate)"
    return timeouts_text({k: v for k, v in t.items() if k != "learned"})


def _render_job(job: dict[str, Any]) -> list[str]:
    """Every node of a multi-node job, as each last published itself."""
    lines = [
        f"job: this node is {job.get('node_rank')} of {job.get('nnodes')} "
        f"(rendezvous round {job.get('round')})",
        f"{'NODE':>4} {'HOST':<20} {'PID':>8} {'STATE':<10} {'GEN':>4} {'RANKS':>5} {'UPDATED':>8}",
    ]
    now = SYSTEM.wall()
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
    """Which guarantee holds the ranks' descendants (docs: guides/production.md)."""
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


def _snapshots_line(snap: dict[str, Any], shown: int = 8) -> str:
    """Held in memory: the bytes against the budget, and per rank its newest step."""
    ranks = list(snap["ranks"].items())
    held = ", ".join(f"rank {r} step {v['step']} ({_age(v['age_s'])} ago, {v['bytes']} B)"
                     for r, v in ranks[:shown])  # fmt: skip
    more = f", {len(ranks) - shown} more ranks" if len(ranks) > shown else ""
    line = f"snapshots: {snap['bytes']} of {snap['budget']} bytes; {held}{more}"
    return line + (f"\n{_replication_line(snap['replication'])}" if snap.get("replication") else "")


def _replication_line(rep: dict[str, Any], shown: int = 8) -> str:
    """Replicated to the next node: the peer, and per rank the step it keeps and the lag;
    the grid's stride when wider than every step, and the steps retained per rank."""
    peer = rep.get("peer")
    to = "no peer" if not peer else f"to node {peer['node']}" + (" (failed)" if peer.get("failed") else "")
    ranks = list((rep.get("ranks") or {}).items())
    kept = ", ".join(f"rank {r} step {v['replicated_step']} ({v['lag_steps']} steps, {v['lag_s']} s behind)"
                     if v.get("replicated_step") is not None else f"rank {r} none yet"
                     for r, v in ranks[:shown])  # fmt: skip
    grid = f"; every {rep['stride']} steps" if (rep.get("stride") or 1) > 1 else ""
    retained = "; ".join(f"rank {r} steps {', '.join(map(str, v))}"
                         for r, v in list((rep.get("retained") or {}).items())[:shown])  # fmt: skip
    return (f"replication: {to} at {rep.get('rate')} B/s; {kept or 'nothing held'}{grid}"
            + (f"; retained: {retained}" if retained else ""))  # fmt: skip


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
    if s.get("fork_server"):
        fs = s["fork_server"]
        if fs.get("mode") == "on":
            modules = ",".join(fs.get("modules") or [])
            lines.append(f"fork server: pid {fs.get('pid')}, {modules} imported in {fs.get('seconds')} s")
        else:
            lines.append(f"fork server: off ({fs.get('why')})")
    if s.get("checkpoint_interval"):
        lines.append(checkpoint_interval.describe(s["checkpoint_interval"]))
    if (s.get("snapshots") or {}).get("ranks"):
        lines.append(_snapshots_line(s["snapshots"]))
    if s.get("dropped"):
        lines.append("dropped messages: " + format_fields(s["dropped"]))
    for lookup in s.get("reverse_dns_slow") or ():  # every torch store connection waits as long
        lines.append(f"reverse DNS: {lookup.get('address')} took {lookup.get('seconds')} s "
                     f"({lookup.get('outcome')})")  # fmt: skip
    if s.get("job"):
        lines += _render_job(s["job"])
    lines.append(f"run dir: {s['run_dir']}")
    return "\n".join(lines)
