"""Soak: a real 2-rank training run under ft-supervisor while everything that must not
wedge the daemon happens at once, and a count of the daemon's wrong decisions.

    python scripts/bench/soak.py [--duration 180] [--seed 1] [--out DIR]
        [--faults N] [--fault-gap LO-HI] [--train SCRIPT] [--preload MODULES]

The job is ``scripts/train.py`` (DDP over gloo on CPU, a snapshot every 10 steps,
resumed after each restart). For ``--duration`` seconds, on a seeded schedule:

* rank faults (what the daemon must recover): a rank SIGKILLed, SIGSEGV'd, or
  SIGSTOPped (a hang the heartbeat timeout must find), one at a time, each once the
  previous one's generation steps again; between two, now and then, the log
  filesystem filled (a small tmpfs, when root) for up to 2 s, then freed;
* chaos (what must change nothing): garbage and well-formed but unauthenticated rank
  messages on ranks.sock, bursts of status requests on control.sock, subscriptions to
  thousands of topics on events.sock, metrics clients that never send a request, the
  daemon SIGSTOPped for 1-3 s, SIGHUP with a config file that is an endless YAML
  alias, not UTF-8, or too big.

``--faults N`` ends the chaos after N rank faults instead (``--duration`` still the
bound), ``--fault-gap`` is the seconds of progress before each fault (default 1-5),
``--train`` another job with train.py's command line (the test's is torch-free:
tests/fixtures/ranks/lockstep.py) and ``--preload`` what its standbys preload.

Then SIGTERM, and the count. It exits 1 on any false hang, healthy rank killed,
lost step (a restart that resumed further back than the last snapshot before the
fault) or orphan (a process of the run alive after the daemon, or its cgroup left).

    faults injected / recovered      each rank fault, and those followed by every rank stepping
    false hangs                      rank_hung for a rank that was not stopped
    healthy ranks killed             a decision in a generation with no injected fault
    lost steps                       steps redone beyond a snapshot interval
    orphans                          processes or cgroups of the run left after it
    daemon peak RSS                  VmHWM, sampled until it exits
    worst loop lag                   the daemon's own ``loop.worst_lag`` (stalls excluded)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import become_subreaper, kill_leftovers, read_status_kb

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "scripts" / "train.py"
# the soak is about decisions under chaos, and ends by SIGTERM: standbys that preload what
# DDP imports on first use make each restart ~1.5 s shorter, so more faults fit (the
# default leaves torch._dynamo out: docs/guides/standbys.md)
PRELOAD = "torch,torch.distributed,torch.nn.parallel,torch._dynamo"
SAVE_EVERY = 10
HEARTBEAT_TIMEOUT = 4.0
BAD_CONFIGS: dict[str, bytes] = {
    "alias": b"a: &a [*a]\n",
    "not_utf8": b"fault_tolerance:\n  rank_heartbeat_timeout: 4\n  # \xff\xfe\n",
    "huge": b"# " + b"x" * (2 << 20) + b"\n",
}
GOOD_CONFIG = b"fault_tolerance:\n  safety_factor: 5\n"


def _log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Run:
    """One daemon and what happened to it."""

    proc: subprocess.Popen[bytes]
    home: Path
    logs: Path
    events_file: Path | None = None
    endpoints: Path | None = None
    faults: list[dict[str, Any]] = field(default_factory=list)  # {"kind", "rank", "generation", "t"}
    stalls: list[tuple[float, float]] = field(default_factory=list)  # daemon SIGSTOPped, wall times
    chaos: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # faults not recovered, chaos threads that failed
    peak_rss_kb: int = 0
    stop = threading.Event()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def events(self) -> list[dict[str, Any]]:
        if self.events_file is None:
            found = list(self.logs.glob("*/*/events.jsonl"))
            if not found:
                return []
            self.events_file = found[0]
        out = []
        with contextlib.suppress(OSError):
            for line in self.events_file.read_bytes().splitlines():
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def count(self, what: str) -> None:
        self.chaos[what] = self.chaos.get(what, 0) + 1


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")


def _milestones(path: Path) -> list[dict[str, Any]]:
    with contextlib.suppress(OSError):
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return []


def _rank_pids(run: Run, generation: int) -> dict[int, int]:
    return {
        e["rank"]: e["pid"]
        for e in run.events()
        if e["event"] == "rank_spawned" and e["generation"] == generation
    }


def _current_generation(run: Run) -> int:
    started = [e["generation"] for e in run.events() if e["event"] == "generation_started"]
    return max(started, default=-1)


def _stepping(milestones: Path, generation: int) -> bool:
    """Every rank of ``generation`` took its first step."""
    return {
        m["rank"]
        for m in _milestones(milestones)
        if m["event"] == "first_step" and m["generation"] == generation
    } == {0, 1}


# -- chaos -----------------------------------------------------------------------------


def _zmq_chaos(run: Run, rng: random.Random) -> None:
    """Forged rank messages, control bursts, topic floods: in one thread, paced, until stopped."""
    import zmq  # noqa: PLC0415 - the daemon's own dependency

    assert run.endpoints is not None
    ctx = zmq.Context()
    try:
        while not run.stop.is_set():
            pick = rng.choice(["forge", "garbage", "control", "topics"])
            sock = ctx.socket(zmq.SUB if pick == "topics" else zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            name = {"forge": "ranks", "garbage": "ranks", "control": "control", "topics": "events"}[pick]
            sock.connect(f"ipc://{run.endpoints / f'{name}.sock'}")
            if pick == "forge":  # well formed, but no rank's key
                for i in range(2000):
                    kind = ("heartbeat", "request", "timeouts")[i % 3]
                    body = {"v": 1, "type": kind, "rank": i % 2, "generation": 0, "pid": 1,
                            "seq": i, "action": "abort", "reason": "forged",
                            "timeouts": {"heartbeat": 1e308}}  # fmt: skip
                    with contextlib.suppress(zmq.Again):  # not connected yet, or the queue full
                        sock.send(json.dumps(body).encode(), zmq.NOBLOCK)
            elif pick == "garbage":
                for _ in range(2000):
                    with contextlib.suppress(zmq.Again):
                        sock.send(rng.randbytes(rng.randrange(1, 4096)), zmq.NOBLOCK)
            elif pick == "control":
                for _ in range(5000):
                    with contextlib.suppress(zmq.Again):
                        sock.send_multipart([b"", b'{"v": 1, "type": "status", "id": "soak"}'], zmq.NOBLOCK)
                    while sock.poll(0):
                        sock.recv_multipart()
            else:
                for i in range(5000):
                    sock.setsockopt(zmq.SUBSCRIBE, f"soak-{rng.random()}-{i}".encode())
            run.count(pick)
            run.stop.wait(rng.uniform(0.5, 1.5))
            sock.close()
    finally:
        ctx.term()


def _reporting(run: Run, target: Callable[..., None], *args: Any) -> None:
    """A chaos thread that fails is a harness failure, not silence."""
    try:
        target(*args)
    except Exception as exc:
        run.errors.append(f"{target.__name__}: {exc!r}")


def _metrics_chaos(run: Run, port: int) -> None:
    """Clients that connect and never finish a request."""
    held: list[socket.socket] = []
    try:
        while not run.stop.is_set():
            with contextlib.suppress(OSError):
                s = socket.create_connection(("127.0.0.1", port), timeout=1)
                s.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
                held.append(s)
                run.count("metrics_slow_client")
            if len(held) > 20:
                held.pop(0).close()
            run.stop.wait(0.5)
    finally:
        for s in held:
            s.close()


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[bool]:
    """A small tmpfs at ``where`` when root; False (and nothing mounted) otherwise."""
    mounted = False
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                                 check=False, capture_output=True).returncode == 0  # fmt: skip
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(run: Run, seconds: float) -> None:
    filler = run.logs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 65536)
        run.count("disk_full")
        run.stop.wait(seconds)
    finally:
        os.close(fd)
        filler.unlink()


def _full_disk(run: Run, rng: random.Random, milestones: Path) -> None:
    """Fill the log filesystem while the ranks step, not while a generation starts: a
    rank that cannot write its own files fails (ENOSPC), and rightly ends the run."""
    gen = _current_generation(run)
    _wait(lambda: _stepping(milestones, gen), 60, f"generation {gen} to step")
    _fill(run, rng.uniform(0.5, 2.0))


def _stall(run: Run, seconds: float) -> None:
    t0 = time.time()
    os.kill(run.pid, signal.SIGSTOP)
    try:
        run.stop.wait(seconds)  # the fault injected: how long the daemon is stopped
    finally:
        os.kill(run.pid, signal.SIGCONT)
    run.stalls.append((t0, time.time()))
    run.count("daemon_stopped")


def _bad_reload(run: Run, config: Path, rng: random.Random) -> None:
    kind = rng.choice(sorted(BAD_CONFIGS))
    config.write_bytes(BAD_CONFIGS[kind])
    before = sum(1 for e in run.events() if e["event"] == "reload_failed")
    os.kill(run.pid, signal.SIGHUP)
    with contextlib.suppress(TimeoutError):
        _wait(
            lambda: sum(1 for e in run.events() if e["event"] == "reload_failed") > before,
            10,
            "reload_failed",
        )
    config.write_bytes(GOOD_CONFIG)
    run.count(f"sighup_{kind}")


def _side_chaos(run: Run, rng: random.Random, config: Path) -> None:
    """The daemon-level chaos, one at a time, while the rank faults go on."""
    while not run.stop.is_set():
        if rng.random() < 0.5:
            _stall(run, rng.uniform(1.0, 3.0))
        else:
            _bad_reload(run, config, rng)
        run.stop.wait(rng.uniform(1.0, 4.0))


# -- rank faults -----------------------------------------------------------------------


def _inject(run: Run, rng: random.Random, milestones: Path, gap: tuple[float, float]) -> None:
    gen = _current_generation(run)
    _wait(lambda: _stepping(milestones, gen), 60, f"generation {gen} to step")
    run.stop.wait(rng.uniform(*gap))  # some progress first: a snapshot, perhaps
    if run.stop.is_set():
        return
    rank = rng.randrange(2)
    pid = _rank_pids(run, gen).get(rank)
    if pid is None:
        return
    kind = rng.choice(["SIGKILL", "SIGSEGV", "SIGSTOP"])
    run.faults.append({"kind": kind, "rank": rank, "generation": gen, "t": time.time()})
    _log(f"fault: {kind} rank {rank} of generation {gen}")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, getattr(signal, kind))
    _wait(lambda: _current_generation(run) > gen, 60, f"a restart after generation {gen}'s {kind}")


# -- the count ---------------------------------------------------------------------------


def _orphans(token: str | None, cgroup: str | None) -> list[str]:
    found = []
    if token is not None:
        needle = f"FT_SUPERVISOR_TOKEN={token}".encode()
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                with contextlib.suppress(OSError):
                    if needle in (p / "environ").read_bytes():
                        found.append(f"pid {p.name}")
    if cgroup is not None and Path(cgroup).exists():
        found.append(f"cgroup {cgroup}")
    return found


def _token(run: Run) -> str | None:
    for pid in _rank_pids(run, 0).values():
        with contextlib.suppress(OSError):
            for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                if item.startswith(b"FT_SUPERVISOR_TOKEN="):
                    return item.split(b"=", 1)[1].split(b"/")[0].decode()
    return None


def count(run: Run, milestones: Path) -> dict[str, Any]:
    events = run.events()
    hangs = [e for e in events if e["event"] == "rank_hung"]
    stopped = {(f["generation"], f["rank"]) for f in run.faults if f["kind"] == "SIGSTOP"}
    faulted = {f["generation"] for f in run.faults}
    decisions = [e for e in events if e["event"] == "decision" and e.get("action") != "continue"]
    firsts = {
        (m["generation"], m["rank"]): m["step"] for m in _milestones(milestones) if m["event"] == "first_step"
    }
    ended = {e["generation"]: e.get("iteration") for e in events if e["event"] == "generation_ended"}
    recovered, lost = 0, []
    for f in run.faults:
        nxt = f["generation"] + 1
        if (nxt, 0) in firsts and (nxt, 1) in firsts:
            recovered += 1
            reached = ended.get(f["generation"])
            resumed = min(firsts[(nxt, 0)], firsts[(nxt, 1)])
            if reached is not None and reached - resumed > SAVE_EVERY:
                lost.append(f"generation {f['generation']}: reached {reached}, resumed at {resumed}")
    status = next((e for e in reversed(events) if e["event"] == "status"), {})
    return {
        "faults": len(run.faults),
        "recovered": recovered,
        "false_hangs": [e for e in hangs if (e["generation"], e["rank"]) not in stopped],
        "false_kills": [e for e in decisions if e["generation"] not in faulted],
        "lost": lost,
        "worst_lag_ms": round(1000 * float((status.get("loop") or {}).get("worst_lag", 0.0)), 1),
        "stalled": [e for e in events if e["event"] == "daemon_stalled"],
    }


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Plan:
    """What runs, and for how long."""

    duration: float = 180.0
    seed: int = 1
    faults: int = 0  # 0: as many as fit in the duration
    gap: tuple[float, float] = (1.0, 5.0)
    train: Path = TRAIN
    preload: str = PRELOAD


def soak(plan: Plan, out: Path) -> int:
    duration, seed = plan.duration, plan.seed
    rng = random.Random(seed)
    become_subreaper()
    home, logs = out / "home", out / "logs"
    home.mkdir(parents=True, exist_ok=True)
    logs.mkdir(exist_ok=True)
    config, milestones, snapshot = out / "ft.yaml", out / "milestones.jsonl", out / "snapshot.pt"
    config.write_bytes(GOOD_CONFIG)
    metrics_port = _port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "XDG_RUNTIME_DIR": str(home)}
    argv = [sys.executable, "-m", "supervisor", "run", "--nproc-per-node", "2", "--log-dir", str(logs),
            "--max-restarts", "1000", "--ft-cfg-path", str(config), "--metrics-port", str(metrics_port),
            "--ft-rank-heartbeat-timeout", str(HEARTBEAT_TIMEOUT),
            "--ft-initial-rank-heartbeat-timeout", "120",
            "--preload", plan.preload,
            str(plan.train), "--steps", "1000000", "--step-time", "0.05", "--save-every", str(SAVE_EVERY),
            "--heartbeat", "--print-every", "100000", "--snapshot", str(snapshot),
            "--events", str(milestones)]  # fmt: skip
    with _tmpfs(logs, "16m") as disk:
        stderr = (out / "daemon.stderr").open("wb")
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True, cwd=out)  # fmt: skip
        run = Run(proc, home, logs)
        threads: list[threading.Thread] = []
        cgroup, token = None, None
        chaos_for = 0.0
        try:
            def stepping() -> bool:
                if proc.poll() is not None:  # no point waiting out the 120 s: say why at once
                    raise RuntimeError(f"the daemon exited ({proc.returncode}) before generation 0 stepped:\n"
                                       + (out / "daemon.stderr").read_text(errors="replace")[-3000:])
                return _stepping(milestones, 0)

            _wait(stepping, 120, "generation 0 to step")
            token = _token(run)
            cgroup = next((e.get("cgroup") for e in run.events() if e["event"] == "containment"), None)
            from supervisor.transport.endpoints import running_daemons  # noqa: PLC0415

            here = {"XDG_RUNTIME_DIR": str(home)}
            mine = lambda: next((d["dir"] for d in running_daemons(here) if d["pid"] == proc.pid), None)  # noqa: E731
            found = _wait(mine, 30, "the endpoints")
            run.endpoints = Path(found)
            _log(f"daemon {proc.pid} stepping; chaos for {duration:g}s (log tmpfs: {disk})")
            chaos = ((_zmq_chaos, (run, random.Random(rng.random()))),
                     (_metrics_chaos, (run, metrics_port)),
                     (_side_chaos, (run, random.Random(rng.random()), config)))  # fmt: skip
            for target, args in chaos:
                t = threading.Thread(target=_reporting, args=(run, target, *args), daemon=True)
                t.start()
                threads.append(t)
            began = time.monotonic()
            end = began + duration

            def more() -> bool:
                return plan.faults == 0 or len(run.faults) < plan.faults

            try:
                while time.monotonic() < end and proc.poll() is None and more():
                    _inject(run, rng, milestones, plan.gap)
                    if disk and more() and rng.random() < 0.5:
                        _full_disk(run, rng, milestones)
                    run.peak_rss_kb = max(run.peak_rss_kb, read_status_kb(proc.pid, "VmHWM").get("VmHWM", 0))
            except TimeoutError as exc:  # a fault not recovered: counted below, and the run stops
                run.errors.append(str(exc))
            run.stop.set()
            chaos_for = time.monotonic() - began
            for t in threads:
                t.join(30)
            gen = _current_generation(run)
            before = sum(1 for e in run.events() if e["event"] == "status")
            with contextlib.suppress(TimeoutError):
                _wait(lambda: _stepping(milestones, gen), 60, f"generation {gen} to step after the chaos")
                os.kill(proc.pid, signal.SIGUSR1)  # the daemon's own status, with its loop figures
                _wait(
                    lambda: sum(1 for e in run.events() if e["event"] == "status") > before, 30, "the status"
                )
            run.peak_rss_kb = max(run.peak_rss_kb, read_status_kb(proc.pid, "VmHWM").get("VmHWM", 0))
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            code = proc.wait(60)
        finally:
            run.stop.set()
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            stderr.close()
        with contextlib.suppress(TimeoutError):
            _wait(lambda: not _orphans(token, cgroup), 10, "the run's processes to go")
        orphans = _orphans(token, cgroup) + kill_leftovers(3.0)
        figures = count(run, milestones)
    return report(run, figures, orphans, code, chaos_for)


def report(run: Run, f: dict[str, Any], orphans: list[str], code: int, duration: float) -> int:
    rows = [
        ("duration", f"{duration:.0f} s"),
        ("faults injected", f["faults"]),
        ("faults recovered", f["recovered"]),
        ("false hang declarations", len(f["false_hangs"])),
        ("healthy ranks killed", len(f["false_kills"])),
        ("lost steps", len(f["lost"])),
        ("orphans left", len(orphans)),
        ("daemon peak RSS (target < 64 MiB)", f"{run.peak_rss_kb / 1024:.1f} MiB"),
        ("worst loop lag outside stalls (target < 50 ms)", f"{f['worst_lag_ms']} ms"),
        ("daemon stalls noticed / injected", f"{len(f['stalled'])} / {len(run.stalls)}"),
        ("daemon exit code", code),
        ("chaos", ", ".join(f"{k} {v}" for k, v in sorted(run.chaos.items()))),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n| measure" + " " * (width - 7) + " | value |\n|" + "-" * (width + 2) + "|---|")
    for k, v in rows:
        print(f"| {k.ljust(width)} | {v} |")
    problems = [f"false hang: {e}" for e in f["false_hangs"]] + [
        f"healthy rank killed: {e}" for e in f["false_kills"]
    ]
    problems += [f"lost steps: {x}" for x in f["lost"]] + [f"orphan: {x}" for x in orphans]
    if f["recovered"] < f["faults"]:
        problems.append(f"only {f['recovered']} of {f['faults']} faults recovered")
    if code != 128 + signal.SIGTERM:
        problems.append(f"the daemon exited {code}, not {128 + signal.SIGTERM} (SIGTERM)")
    problems += run.errors
    for p in problems:
        print(f"FAIL {p}")
    return 1 if problems else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=180.0, help="seconds of chaos (default 180)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--faults", type=int, default=0, help="end after this many rank faults (default 0: "
                   "as many as fit in --duration, which still bounds the run)")  # fmt: skip
    p.add_argument(
        "--fault-gap", default="1-5", help="seconds of progress before each fault, LO-HI (default 1-5)"
    )
    p.add_argument("--train", type=Path, default=TRAIN, help="the job, with train.py's command line")
    p.add_argument("--preload", default=PRELOAD, help=f"what the standbys preload (default {PRELOAD})")
    p.add_argument(
        "--out", type=Path, default=None, help="where the run goes (default: a temporary directory)"
    )
    a = p.parse_args()
    lo, _, hi = a.fault_gap.partition("-")
    plan = Plan(a.duration, a.seed, a.faults, (float(lo), float(hi or lo)), a.train.resolve(), a.preload)
    if a.out is None:
        with tempfile.TemporaryDirectory(prefix="ft-soak-") as tmp:
            return soak(plan, Path(tmp))
    a.out.mkdir(parents=True, exist_ok=True)
    return soak(plan, a.out.resolve())


if __name__ == "__main__":
    raise SystemExit(main())
