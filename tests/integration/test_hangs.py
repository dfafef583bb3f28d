"""Hang detection through the whole daemon, with real ranks using supervisor.client:
what needs real processes (faulthandler dumps, SIGSTOP/SIGCONT, sockets, the CLI).
Deadlines, warm-up, sections and learned timeouts: tests/fast/test_hangs.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import zmq

from supervisor.process.native import py_spy
from supervisor.transport.endpoints import running_daemons
from tests.support import RANKS, Daemon, proc_state, rank_pids, wait_until

MONITORED = str(RANKS / "monitored.py")
FAST = ("--nproc-per-node", "2", "--preload", "none")
Start = Callable[..., Daemon]


def _stderr_log(d: Daemon, generation: int, local_rank: int) -> str:
    run_dir = d.run_dir()
    assert run_dir is not None
    return (run_dir / f"gen_{generation}" / f"local_rank_{local_rank}" / "stderr.log").read_text()


def test_a_rank_that_stops_heartbeating_is_found_dumped_killed_and_restarted(start: Start) -> None:
    d = start(*FAST, "--max-restarts", "1", "--ft-rank-heartbeat-timeout", "0.5",
              MONITORED, "--heartbeat", "--hang-at", "5")  # fmt: skip
    assert d.wait() == 0, d.story()
    # the deadline's timing and the decision's inputs: tests/fast/test_hangs.py; here the
    # real chain: the rank's own faulthandler dump into its log, then SIGKILL
    hung = d.events("rank_hung")
    assert [(e["rank"], e["kind"]) for e in hung] == [(1, "heartbeat")]
    dumped = {e["rank"]: e for e in d.events("stacks_dumped")}
    assert dumped[1]["where"] == "own" and "monitored.py" in dumped[1]["stacks"]
    log = _stderr_log(d, 0, 1)
    assert "most recent call first" in log and "monitored.py" in log  # the stacks, in its own log
    decision = d.events("decision")[0]
    assert (decision["action"], decision["reason"]) == ("restart", "rank_hung")
    killed = next(e for e in d.events("rank_exited") if e["generation"] == 0 and e["rank"] == 1)
    assert killed["signal"] == "SIGKILL"  # rank_termination_signal, no grace for a hung rank
    assert "rank 1 generation 1 done" in d.stdout()


def test_a_sigstopped_rank_is_found_left_stopped_while_judged_and_killed(start: Start) -> None:
    d = start(*FAST, "--max-restarts", "1", "--ft-rank-heartbeat-timeout", "0.5",
              MONITORED, "--heartbeat", "--hang-at", "5", "--hang-how", "stop")  # fmt: skip
    assert d.wait() == 0, d.story()
    assert d.events("rank_hung")[0]["rank"] == 1
    assert "SIGSTOP" not in d.stderr()
    # not woken to dump its stacks (it would run on while judged); py-spy read them from its memory
    assert "most recent call first" not in _stderr_log(d, 0, 1)
    (bundle,) = d.events("hang_bundle")
    manifest = json.loads((Path(bundle["path"]) / "bundle.json").read_text())
    stopped = next(r for r in manifest["ranks"] if r["rank"] == 1)
    assert (stopped["where"], stopped["flight_recorder"]) == ("stopped", None), stopped
    if py_spy() is not None:
        assert "monitored.py" in (Path(bundle["path"]) / stopped["native_stacks"]).read_text()


def _garbage_everywhere(endpoints: Path) -> None:
    """Raw bytes to every socket file, and bad ZeroMQ messages of every kind."""
    for sock_file in endpoints.glob("*.sock"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(str(sock_file))
            raw.sendall(os.urandom(4096))
    ctx = zmq.Context()
    try:
        ranks = ctx.socket(zmq.DEALER)
        ranks.setsockopt(zmq.LINGER, 1000)
        ranks.connect(f"ipc://{endpoints / 'ranks.sock'}")
        for payload in (
            b"not json",
            b"[]",
            orjson.dumps({"v": 99, "type": "heartbeat", "rank": 0, "gen": 0}),
            orjson.dumps({"v": 1, "type": "teleport", "rank": 0, "gen": 0}),
            orjson.dumps({"v": 1, "type": "heartbeat", "rank": 99, "gen": 0}),
            orjson.dumps({"v": 1, "type": "heartbeat", "rank": 0, "gen": 7}),
            b"{" + b" " * (2 << 20) + b"}",  # oversized, under zmq's hard cap
        ):
            ranks.send(payload)
        ranks.send_multipart([b"two", b"frames"])
        ranks.close()
        control = ctx.socket(zmq.REQ)
        control.setsockopt(zmq.LINGER, 0)
        control.connect(f"ipc://{endpoints / 'control.sock'}")
        control.send(b"\xff garbage")
        assert control.poll(10_000)
        assert orjson.loads(control.recv())["ok"] is False
        control.close()
        events = ctx.socket(zmq.DEALER)  # the wrong socket type for a PUB endpoint
        events.setsockopt(zmq.LINGER, 0)
        events.connect(f"ipc://{endpoints / 'events.sock'}")
        events.send(b"junk", zmq.NOBLOCK)
        events.close()
    finally:
        ctx.destroy(linger=0)  # closes the sockets a failed assertion left open


def _status(pid: int) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-m", "supervisor", "status", "--json", "--pid", str(pid)],
                       capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    data: dict[str, object] = json.loads(r.stdout)
    return data


def test_garbage_on_every_endpoint_is_counted_and_survived(start: Start) -> None:
    d = start(*FAST, "--ft-rank-heartbeat-timeout", "30", MONITORED, "--heartbeat", "--steps", "100000")
    d.wait_event("rank_connected", count=2)
    endpoints = Path(next(i["dir"] for i in running_daemons() if i["pid"] == d.pid))
    _garbage_everywhere(endpoints)
    wanted = {"malformed", "unknown_version", "unknown_type", "unknown_rank", "stale_generation", "oversized"}
    wait_until(lambda: wanted <= set(_status(d.pid)["dropped"]), 30, "every drop to be counted")  # type: ignore[arg-type]
    status = _status(d.pid)
    assert status["dropped"]["control_malformed"] >= 1  # type: ignore[index]
    assert all(r["state"] == "running" for r in status["ranks"])  # type: ignore[attr-defined]
    assert d.proc.poll() is None
    assert len(d.events("message_dropped")) == len(wanted)  # logged once per reason
    d.signal(signal.SIGTERM)
    assert d.wait() == 128 + signal.SIGTERM


def test_operator_commands(start: Start) -> None:
    d = start(*FAST, "--ft-rank-heartbeat-timeout", "30", "--ft-rank-section-timeouts", "step:30",
              MONITORED, "--heartbeat", "--section", "step", "--iterations", "--steps", "100000")  # fmt: skip
    d.wait_event("rank_connected", count=2)
    wait_until(lambda: all(r.get("iteration") for r in _status(d.pid)["ranks"]), 30, "iterations")  # type: ignore[attr-defined]
    table = subprocess.run([sys.executable, "-m", "supervisor", "status", "--pid", str(d.pid)],
                           capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    assert "generation 0" in table and "running" in table
    assert "timeouts: heartbeat 30 s, section step 30 s" in table and '{"' not in table  # no JSON
    assert str(rank_pids(d, 0)[0]) in table
    ctl = [sys.executable, "-m", "supervisor"]
    subprocess.run([*ctl, "restart", "--pid", str(d.pid)], check=True, timeout=30, capture_output=True)
    d.wait_event("generation_started", where=lambda e: e["generation"] == 1)
    assert d.events("decision")[0]["reason"] == "operator_request"  # not charged: tests/fast/test_loop.py
    events = subprocess.run([*ctl, "events", "--pid", str(d.pid)], capture_output=True, text=True,
                            timeout=30, check=True).stdout  # fmt: skip
    assert "restart_requested" in events and "generation_started: generation 1 on " in events
    subprocess.run([*ctl, "stop", "--pid", str(d.pid)], check=True, timeout=30, capture_output=True)
    assert d.wait() == 128 + signal.SIGTERM
    gone = subprocess.run([*ctl, "status", "--pid", str(d.pid)], capture_output=True, text=True, timeout=30)
    assert gone.returncode == 1 and "no running ft-supervisor daemon" in gone.stderr


def test_a_stopped_rank_is_not_left_stopped(start: Start) -> None:
    """SIGCONT comes before the kill: a stopped process would ignore the rest."""
    d = start(*FAST, "--ft-rank-heartbeat-timeout", "0.5", MONITORED, "--heartbeat",
              "--hang-at", "2", "--hang-how", "stop")  # fmt: skip
    pid = wait_until(lambda: next((p for p in rank_pids(d, 0)[1:] if proc_state(p) == "T"), None), 30, "stop")
    assert d.wait() == 200
    assert proc_state(pid) is None


def test_a_request_made_just_before_exiting_reaches_the_daemon(start: Start) -> None:
    d = start(*FAST, "--max-restarts", "3", MONITORED, "--request-and-exit", "reschedule", "--steps", "1")
    assert d.wait() == 200
    assert [(e["rank"], e["action"]) for e in d.events("workload_request")] == [(1, "reschedule")]
    decision = d.events("decision")[0]
    assert (decision["action"], decision["reason"]) == ("reschedule", "workload_request")
