"""Hang detection through the whole daemon, with real ranks using supervisor.client."""

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
    hung = d.events("rank_hung")
    assert [(e["rank"], e["kind"], e["timeout"]) for e in hung] == [(1, "heartbeat", 0.5)]
    assert hung[0]["open_for"] >= 0.5
    assert hung[0]["late_by"] < 1.0  # timers, not a coarse poll (precision: scripts/bench/hang.py)
    dumped = {e["rank"]: e for e in d.events("stacks_dumped")}
    assert dumped[1]["where"] == "own" and "monitored.py" in dumped[1]["stacks"]
    log = _stderr_log(d, 0, 1)
    assert "most recent call first" in log and "monitored.py" in log  # the stacks, in its own log
    decision = d.events("decision")[0]
    assert (decision["action"], decision["reason"]) == ("restart", "rank_hung")
    killed = next(e for e in d.events("rank_exited") if e["generation"] == 0 and e["rank"] == 1)
    assert killed["signal"] == "SIGKILL"  # rank_termination_signal, no grace for a hung rank
    assert "rank 1 generation 1 done" in d.stdout()


def test_a_section_open_too_long(start: Start) -> None:
    options = (
        "--max-restarts",
        "1",
        "--ft-rank-section-timeouts",
        "step:0.5",
        "--ft-num-warmup-iterations",
        "0",
    )
    d = start(*FAST, *options, MONITORED, "--section", "step", "--hang-at", "3")
    assert d.wait() == 0, d.story()
    hung = d.events("rank_hung")
    assert [(e["kind"], e["section"]) for e in hung] == [("section", "step")]


def test_warmup_iterations_do_not_trip_the_step_timeout(start: Start) -> None:
    slow = ("--section", "step", "--slow-steps", "3", "--slow-time", "0.6", "--steps", "8")
    ok = start(*FAST, "--ft-rank-section-timeouts", "step:0.3", "--ft-num-warmup-iterations", "3",
               MONITORED, *slow)  # fmt: skip
    assert ok.wait() == 0, ok.stderr()
    assert not ok.events("rank_hung")
    # the same run without warm-up iterations is hung: the check above can fail
    tripped = start(*FAST, "--ft-rank-section-timeouts", "step:0.3", "--ft-num-warmup-iterations", "0",
                    MONITORED, *slow)  # fmt: skip
    assert tripped.wait() == 200  # a hang is transient: with no restart left, run elsewhere
    assert tripped.events("rank_hung")[0]["section"] == "step"


def test_out_of_section_timeout_for_a_workload_without_sections(start: Start) -> None:
    d = start(*FAST, "--max-restarts", "1", "--ft-rank-out-of-section-timeout", "0.5",
              MONITORED, "--iterations", "--hang-at", "4", "--hang-how", "outside")  # fmt: skip
    assert d.wait() == 0, d.story()
    assert [e["kind"] for e in d.events("rank_hung")] == ["out_of_section"]


def test_a_sigstopped_rank_is_found_and_killed(start: Start) -> None:
    d = start(*FAST, "--max-restarts", "1", "--ft-rank-heartbeat-timeout", "0.5",
              MONITORED, "--heartbeat", "--hang-at", "5", "--hang-how", "stop")  # fmt: skip
    assert d.wait() == 0, d.story()
    assert d.events("rank_hung")[0]["rank"] == 1
    assert "SIGSTOP" not in d.stderr()
    assert "most recent call first" in _stderr_log(d, 0, 1)  # SIGCONT let it dump


def test_learned_timeouts_persist_across_a_restart_and_a_new_run(start: Start, tmp_path: Path) -> None:
    learning = ("--ft-rank-section-timeouts", "step:30,checkpointing:30", "--ft-num-warmup-iterations", "2")
    work = (MONITORED, "--section", "step", "--steps", "24", "--checkpoint-every", "8", "--print-timeouts")
    state = tmp_path / "state"
    first = start(*FAST, "--max-restarts", "1", "--state-dir", str(state), *learning, *work,
                  "--hang-at", "22", "--hang-how", "outside")  # fmt: skip
    # generation 0 hangs outside sections at step 22, with no out-of-section timeout
    # set... so end it ourselves once it has learned: a restart through the operator
    wait_until(lambda: "generation 0 done" in first.stdout(), 30, "rank 0 to finish generation 0")
    subprocess.run([sys.executable, "-m", "supervisor", "restart", "--pid", str(first.pid)],
                   check=True, timeout=30, capture_output=True)  # fmt: skip
    learned = first.wait_event("timeouts_learned")[0]["learned"]
    assert 0 < learned["sections"]["step"] < 30
    assert 0 < learned["sections"]["checkpointing"] < 30
    assert first.wait() == 0, first.stderr()
    # generation 1 was told the learned values
    gen1 = [ln for ln in first.stdout().splitlines() if "timeouts" in ln][-1]
    assert str(learned["sections"]["step"]) in gen1
    saved = json.loads((state / "timeouts.json").read_text())
    assert saved["learned"]["sections"]["step"] > 0
    # a new run starts from them
    second = start(*FAST, "--state-dir", str(state), *learning, MONITORED, "--steps", "1")
    assert second.wait() == 0
    started = second.events("run_started")[0]["timeouts"]
    assert started["learned"]["sections"]["step"] == saved["learned"]["sections"]["step"]
    # the configured 30 s stands: learning only raises a timeout the user set
    assert started["sections"]["step"] == 30.0
    # with `none` ("learn it") the learned value is in force, above the floor
    relearn = ("--ft-rank-section-timeouts", "step:none,checkpointing:30",
               "--ft-learned-timeout-floor", "0.01")  # fmt: skip
    third = start(*FAST, "--state-dir", str(state), *relearn, MONITORED, "--steps", "1")
    assert third.wait() == 0
    started = third.events("run_started")[0]["timeouts"]
    assert started["sections"]["step"] == saved["learned"]["sections"]["step"]


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
    assert "generation 0" in table and "running" in table and "heartbeat=30.0" in table
    assert str(rank_pids(d, 0)[0]) in table
    ctl = [sys.executable, "-m", "supervisor"]
    subprocess.run([*ctl, "restart", "--pid", str(d.pid)], check=True, timeout=30, capture_output=True)
    d.wait_event("generation_started", where=lambda e: e["generation"] == 1)
    assert d.events("decision")[0]["reason"] == "operator_request"
    assert _status(d.pid)["restarts_used"] == 0  # an operator's restart is not a failure
    events = subprocess.run([*ctl, "events", "--pid", str(d.pid)], capture_output=True, text=True,
                            timeout=30, check=True).stdout  # fmt: skip
    assert "restart_requested" in events and "generation_started generation=1" in events
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


def test_a_clean_run_that_says_bye_still_teaches_timeouts(start: Start, tmp_path: Path) -> None:
    state = tmp_path / "state"
    d = start(*FAST, "--state-dir", str(state), "--ft-rank-section-timeouts", "step:none,checkpointing:none",
              "--ft-num-warmup-iterations", "2", MONITORED, "--section", "step", "--steps", "24",
              "--checkpoint-every", "8", "--bye")  # fmt: skip
    assert d.wait() == 0, d.story()
    learned = d.events("timeouts_learned")[0]["learned"]["sections"]
    assert set(learned) == {"step", "checkpointing"}
    assert json.loads((state / "timeouts.json").read_text())["learned"]["sections"] == learned


def test_a_request_made_just_before_exiting_reaches_the_daemon(start: Start) -> None:
    d = start(*FAST, "--max-restarts", "3", MONITORED, "--request-and-exit", "reschedule", "--steps", "1")
    assert d.wait() == 200
    assert [(e["rank"], e["action"]) for e in d.events("workload_request")] == [(1, "reschedule")]
    decision = d.events("decision")[0]
    assert (decision["action"], decision["reason"]) == ("reschedule", "workload_request")
