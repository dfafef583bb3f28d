"""Nothing a same-user client, a bad file or a full disk does may stop supervision (issue 12):
real daemons, real ranks, real sockets, a real tmpfs filled to the brim. Forged and runaway
rank messages and a stalled daemon are decisions on virtual time: tests/fast/test_lifecycle_fast.py."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from supervisor.transport.endpoints import running_daemons
from tests.support import RANKS, Daemon, rank_pids, wait_until

Start = Callable[..., Daemon]
MONITORED = str(RANKS / "monitored.py")
BEHAVE = str(RANKS / "behave.py")
FAST = ("--nproc-per-node", "2", "--preload", "none")


def _endpoints(d: Daemon) -> Path:
    return Path(wait_until(lambda: next((i["dir"] for i in running_daemons() if i["pid"] == d.pid), None),
                           30, "the daemon's endpoints"))  # fmt: skip


def _status(pid: int) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-m", "supervisor", "status", "--json", "--pid", str(pid)],
                       capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    data: dict[str, object] = json.loads(r.stdout)
    return data


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_log_filesystem_degrades_the_event_log_not_supervision(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    # issue 12: OSError ENOSPC in events.emit killed the daemon (exit 1)
    home = tmp_path / "d"
    logs = home / "logs"
    logs.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(logs)], check=False).returncode:
        pytest.skip("no tmpfs can be mounted here")
    try:
        # generation g's ranks go on once the test creates go<g>: rank 1 SIGKILLs itself in
        # generation 0, both end well in generation 1
        go = tmp_path / "go"
        d = Daemon(home, (*FAST, "--max-restarts", "2", BEHAVE, "--wait-for", str(go), "--fail-rank", "1",
                          "--fail-generations", "0", "--kill-self", "SIGKILL", "--step"))  # fmt: skip
        daemons.append(d)
        d.wait_event("rank_spawned", where=lambda e: e["generation"] == 1, count=2)  # the standbys
        filler = logs / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            with pytest.raises(OSError, match="No space left"):
                while True:  # to the last block
                    os.write(fd, b"\0" * 65536)
        finally:
            os.close(fd)
        # tmpfs gives by the page: the event log's last one still takes a few lines; status
        # events (SIGUSR1) use it up
        wait_until(lambda: d.signal(signal.SIGUSR1) or "event_log_degraded" in d.stderr(), 30,
                   "the daemon to say its log is degraded", interval=0.2)  # fmt: skip
        Path(f"{go}0").touch()
        wait_until(lambda: "generation_started: generation 1 " in d.stderr(), 30, "the restart")
        filler.unlink()
        Path(f"{go}1").touch()
        assert d.wait(timeout=60) == 0, d.story()
        assert d.stderr().count("event_log_degraded") == 1  # said once
        names = [e["event"] for e in d.events()]
        # what could not be written at the time was kept and written once there was room
        assert "decision" in names and "event_log_restored" in names
        assert names.index("decision") < names.index("event_log_restored")
    finally:
        subprocess.run(["umount", "-l", str(logs)], check=False)


FLOOD = """
import sys, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.setsockopt(zmq.SNDHWM, 0)
s.connect(sys.argv[1])
request = b'{"v": 1, "type": "status", "id": "f"}'
while True:
    s.send_multipart([b"", request])  # as a REQ would frame it, never waiting for the reply
    while s.poll(0):
        s.recv_multipart()
"""


def test_a_flood_of_control_requests_cannot_starve_supervision(start: Start, tmp_path: Path) -> None:
    # issue 12: 200,000 status requests delayed a SIGKILLed rank's exit by 14 s, a SIGTERM by 12 s
    d = start(*FAST, "--max-restarts", "1", "--ft-rank-heartbeat-timeout", "5", MONITORED, "--heartbeat",
              "--iterations", "--steps", "100000", "--step-time", "0.05")  # fmt: skip
    d.wait_event("rank_stepping", count=2)
    control = f"ipc://{_endpoints(d) / 'control.sock'}"
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, control])
    try:
        wait_until(lambda: d.events("control_dropped"), 30, "the flood to be refused as busy")
        victim = rank_pids(d, 0)[1]
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        exited = d.wait_event("rank_exited", where=lambda e: e["pid"] == victim)[0]
        assert exited["t_wall"] - killed < 2.0  # noticed while the flood goes on
        d.wait_event("generation_started", where=lambda e: e["generation"] == 1)
        assert [e["reason"] for e in d.events("control_dropped")] == ["busy"]
        stopped = time.monotonic()
        d.signal(signal.SIGTERM)
        assert d.wait(timeout=30) == 128 + signal.SIGTERM
        assert time.monotonic() - stopped < 10.0
    finally:
        flood.kill()
        flood.wait(10)


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False


@pytest.mark.slow
def test_slow_metrics_clients_cannot_pile_up_threads(start: Start) -> None:
    # issue 12: the metrics endpoint opened one thread per connection, with no timeout (366 threads)
    pytest.importorskip("prometheus_client")
    d = start(*FAST, "--metrics-port", "0", BEHAVE, "--forever")
    port = int(d.wait_event("metrics_serving")[0]["port"])
    # counted once the ranks are spawned: spawning starts threads of its own for a moment
    d.wait_event("generation_started")
    before = _threads(d.pid)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]  # never send a request
    try:
        # beyond MAX_CLIENTS (8) at once, a connection is closed at once, not given a thread
        wait_until(lambda: sum(map(_closed, idle)) >= 90, 30, "the connections beyond 8 to be closed")
        assert _threads(d.pid) <= before + 8
        # idle clients time out and give their threads back; a scrape gets through then
        def scraped() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return b"ft_supervisor_" in r.read()
            except OSError:
                return False
        wait_until(scraped, 30, "a scrape to be served")
    finally:
        for s in idle:
            s.close()
    d.signal(signal.SIGTERM)
    assert d.wait(timeout=30) == 128 + signal.SIGTERM
    # a client that timed out is not news: no traceback per client on the console
    assert "Exception occurred during processing of request" not in d.stderr(), d.stderr()[-2000:]


def test_a_stale_endpoint_directory_is_not_taken_for_a_daemon(tmp_path: Path) -> None:
    # issue 12: a SIGKILLed daemon left its directory; a daemon.json whose pid is now another
    # process made `status` fail
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    base = tmp_path / "ft-supervisor"
    dead = subprocess.Popen(["true"])
    dead.wait()
    impostor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for pid, started in ((dead.pid, 1), (impostor.pid, 1)):  # start times that are not theirs
            here = base / str(pid)
            here.mkdir(parents=True, mode=0o700)
            (here / "daemon.json").write_text(json.dumps({"pid": pid, "run_id": "old", "starttime": started}))
        assert running_daemons(env) == []
        assert not (base / str(dead.pid)).exists()  # the dead one's directory is gone
        assert (base / str(impostor.pid)).exists()  # another process's pid: left alone
        r = subprocess.run([sys.executable, "-m", "supervisor", "status"], env=env, capture_output=True,
                           text=True, timeout=30, check=False)  # fmt: skip
        assert r.returncode != 0 and "Traceback" not in r.stderr and "no" in r.stderr.lower()
    finally:
        impostor.kill()
        impostor.wait(10)


def test_subscriptions_to_the_events_socket_are_bounded(start: Start) -> None:
    # issue 12: 100,000 distinct topics took the daemon from 37 MB to 3.45 GB
    d = start(*FAST, BEHAVE, "--forever")
    d.wait_event("generation_started")
    events = f"ipc://{_endpoints(d) / 'events.sock'}"
    ctx = zmq.Context()
    try:
        greedy = ctx.socket(zmq.XSUB)  # subscriptions as messages: none held back by a queue limit
        greedy.setsockopt(zmq.LINGER, 0)
        greedy.setsockopt(zmq.SNDHWM, 0)
        greedy.connect(events)
        for i in range(100_000):
            greedy.send(b"\x01" + f"topic-{i}".encode())
        wait_until(lambda: _status(d.pid)["dropped"].get("events_too_many_topics", 0) >= 99_000, 60,  # type: ignore[attr-defined]
                   "the topics beyond the bound to be refused")  # fmt: skip
        rss_kb = int(next(ln for ln in Path(f"/proc/{d.pid}/status").read_text().splitlines()
                          if ln.startswith("VmRSS")).split()[1])  # fmt: skip
        assert rss_kb < 80_000
        # a subscriber to everything still hears the daemon
        listener = ctx.socket(zmq.SUB)
        listener.setsockopt(zmq.LINGER, 0)
        listener.setsockopt(zmq.SUBSCRIBE, b"")
        listener.connect(events)

        def heard() -> bool:
            d.signal(signal.SIGUSR1)  # asks the daemon for a status event
            return bool(listener.poll(200)) and listener.recv_multipart()[0] == b"status"

        wait_until(heard, 30, "the status event on the events socket")
        greedy.close()
        listener.close()
    finally:
        ctx.destroy(linger=0)  # closes the sockets a failed assertion left open
    d.signal(signal.SIGTERM)
    assert d.wait(timeout=30) == 128 + signal.SIGTERM


def _max_open(pid: int) -> int:
    line = next(ln for ln in Path(f"/proc/{pid}/limits").read_text().splitlines() if "open files" in ln)
    return int(line.split()[3])


def _rss_kb(pid: int) -> int:
    return int(next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if ln.startswith("VmRSS")).split()[1])  # fmt: skip


def test_a_flood_of_raw_connections_is_bounded_and_supervision_goes_on(start: Start) -> None:
    # issue 12: 40k connections on ranks.sock took RSS from 37 to 113 MB, not levelling off
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 6000:
        pytest.skip(f"this test process may open {soft} files; it needs 6000")
    d = start(*FAST, "--max-restarts", "1", BEHAVE, "--forever")
    d.wait_event("generation_started")
    ranks_sock = str(_endpoints(d) / "ranks.sock")
    before = _rss_kb(d.pid)
    flood: list[socket.socket] = []
    try:
        for _ in range(6000):  # beyond the daemon's 4096 descriptors: the excess waits or fails
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError, ConnectionRefusedError):
                s.connect(ranks_sock)
            flood.append(s)
        assert _rss_kb(d.pid) - before < 40_000
        # a rank's death is still noticed, and the raw connections are let go (handshake timeout)
        victim = rank_pids(d, 0)[1]
        os.kill(victim, signal.SIGKILL)
        d.wait_event("rank_exited", where=lambda e: e["pid"] == victim)
        d.wait_event("generation_started", where=lambda e: e["generation"] == 1)
        wait_until(lambda: len(os.listdir(f"/proc/{d.pid}/fd")) < 200, 10, "raw connections to be dropped")
        assert _rss_kb(d.pid) - before < 40_000
        # what bounds them: the daemon holds at most 4096 descriptors; its ranks got theirs back
        assert _max_open(d.pid) == 4096
        assert _max_open(rank_pids(d, 1)[0]) == soft
    finally:
        for s in flood:
            s.close()
    d.signal(signal.SIGTERM)
    assert d.wait(timeout=30) == 128 + signal.SIGTERM
