"""sd_notify over real datagram sockets: what a service manager would receive."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.clock import Clock
from supervisor.core.catalogue import Event
from supervisor.core.catalogue.daemon import (
    ConfigReloaded,
    ReloadFailed,
    ReloadRequested,
    RunFinished,
    RunStarted,
    StopRequested,
)
from supervisor.core.catalogue.generation import Decision, GenerationStarted
from supervisor.core.catalogue.ranks import RankSpawned
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.services.sdnotify import Notifier, SdNotify


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket, as systemd's; the path short enough for sun_path."""
    with tempfile.TemporaryDirectory(prefix="ftn-") as d:
        path = str(Path(d) / "notify.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        yield sock, path
        sock.close()


def _recv(sock: socket.socket, timeout: float = 5.0) -> str:
    sock.settimeout(timeout)  # the deadline: a datagram that never comes fails the test
    return sock.recv(4096).decode()


def _drained(sock: socket.socket) -> list[str]:
    got = []
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:
            got.append(sock.recv(4096).decode())
    return got


def _started(generation: int) -> GenerationStarted:
    return GenerationStarted(
        generation=generation,
        master_addr="127.0.0.1",
        master_port=29500,
        node_rank=None,
        nnodes=None,
        standby_ranks=0,
        standby_ready=0,
    )


def _spawned(generation: int, local_rank: int, pid: int, *, standby: bool = False) -> RankSpawned:
    return RankSpawned(
        generation=generation, rank=local_rank, local_rank=local_rank, pid=pid, standby=standby, forked=False
    )


def _events(tmp_path: Path) -> EventLog:
    return EventLog(tmp_path / "events.jsonl", logging.getLogger("supervisor.test-sdnotify"), Clock())


def test_a_path_socket_receives_one_datagram_per_notification(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    n = Notifier(path)
    assert n.send("READY=1", "STATUS=running")
    assert n.send("WATCHDOG=1")
    assert _recv(sock) == "READY=1\nSTATUS=running"
    assert _recv(sock) == "WATCHDOG=1"
    assert (n.sent, n.failed) == (2, 0)
    n.close()


def test_an_abstract_socket_is_reached_and_the_variables_leave_the_environment(tmp_path: Path) -> None:
    name = f"ft-sdnotify-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    environ = {"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "3000000", "PATH": "/bin"}
    events = _events(tmp_path)
    try:
        sd = SdNotify.from_environ(environ, os.getpid(), events)
        assert environ == {"PATH": "/bin"}  # ranks must not inherit them
        assert sd.watchdog_interval == 1.5
        assert sd.notifier.send("READY=1")
        assert _recv(sock) == "READY=1"
        sd.close()
    finally:
        sock.close()
        events.close()


def test_without_notify_socket_everything_is_a_no_op(tmp_path: Path) -> None:
    events = _events(tmp_path)
    sd = SdNotify.from_environ({"WATCHDOG_USEC": "1000"}, os.getpid(), events)
    events.listeners.append(sd.hear)
    events.emit(_started(0))
    assert not sd.notifier.send("READY=1")
    assert sd.watchdog_interval is None  # nobody to ping
    assert asyncio.run(asyncio.wait_for(sd.watchdog(), 5)) is None  # returns at once
    events.close()
    assert [line for line in (tmp_path / "events.jsonl").read_text().splitlines() if "notify" in line] == []


def test_a_missing_socket_or_a_full_queue_never_blocks_nor_raises(
    tmp_path: Path, listener: tuple[socket.socket, str]
) -> None:
    gone = Notifier(str(tmp_path / "nobody-listens.sock"))
    assert not gone.send("READY=1")
    assert gone.failed == 1 and gone.error is not None and "FileNotFoundError" in gone.error
    gone.close()
    _, path = listener  # bound, never read: its queue fills
    full = Notifier(path)
    results = [full.send(f"STATUS={i}") for i in range(5000)]
    assert results[0] and not all(results)  # some were dropped instead of waited for
    assert full.error is not None and "BlockingIOError" in full.error
    full.close()


def test_the_lifecycle_reaches_the_socket_from_the_event_log(
    tmp_path: Path, listener: tuple[socket.socket, str]
) -> None:
    sock, path = listener
    events = _events(tmp_path)
    sd = SdNotify(Notifier(path), None, events)
    events.listeners.append(sd.hear)

    def said(event: Event) -> list[str]:
        events.emit(event)
        return _drained(sock)  # the send is synchronous: whatever it sent is queued already

    started = RunStarted(run_dir=str(tmp_path), pid=1, control="ipc://c", nproc_per_node=2, max_restarts=3,
                         program="train.py", standby=False, preload=None, timeouts={}, policy={},
                         restart_window=None)  # fmt: skip
    assert said(started) == ["STATUS=starting"]
    for lr in (0, 1):
        assert said(_spawned(0, lr, 100 + lr)) == []  # not up yet
    assert said(_started(0)) == ["READY=1\nSTATUS=running generation 0 with 2 ranks"]
    decision = Decision(
        generation=0,
        action="restart",
        reason="rank_failed",
        detail="rank 1 exited 1",
        rule=None,
        category=None,
        rank=1,
        classifier=None,
        lines=None,
        restarts_used=1,
    )
    assert said(decision) == ["STATUS=restarting after rank_failed (generation 0)"]
    for lr in (0, 1):
        said(_spawned(1, lr, 200 + lr, standby=True))
    # READY only once
    assert said(_started(1)) == ["STATUS=running generation 1 with 2 ranks"]
    (reloading,) = said(ReloadRequested(path="/etc/ft.yaml"))
    lines = reloading.split("\n")
    usec = int(lines[1].removeprefix("MONOTONIC_USEC="))
    assert lines[0] == "RELOADING=1" and 0 <= time.monotonic_ns() // 1000 - usec < 5_000_000
    assert lines[2:] == ["STATUS=reloading /etc/ft.yaml"]
    reloaded = ConfigReloaded(path="/etc/ft.yaml", changed=None, not_applied=None, timeouts={})
    assert said(reloaded) == ["READY=1\nSTATUS=running generation 1 with 2 ranks"]
    assert said(ReloadFailed(path="/etc/ft.yaml", error="config file /etc/ft.yaml: not valid YAML")) == [
        "READY=1\nSTATUS=running generation 1 with 2 ranks; reload failed: "
        "config file /etc/ft.yaml: not valid YAML"
    ]
    assert said(StopRequested(signal="SIGTERM")) == ["STOPPING=1\nSTATUS=stopping on SIGTERM"]
    finished = RunFinished(exit_code=143, restarts_used=1, seconds=2.0, daemon_max_rss_kb=1, daemon_cpu_s=0.1,
                           run_dir=str(tmp_path))  # fmt: skip
    assert said(finished) == ["STATUS=finished, exit code 143"]  # STOPPING once
    events.close()
    sd.close()


def test_notify_failure_is_reported_once_and_the_listener_stays(tmp_path: Path) -> None:
    events = _events(tmp_path)
    sd = SdNotify(Notifier(str(tmp_path / "absent.sock")), None, events)
    events.listeners.append(sd.hear)
    events.emit(_started(0))
    events.emit(StopRequested(signal="SIGINT"))
    events.close()
    sd.close()
    assert sd.hear in events.listeners
    lines = (tmp_path / "events.jsonl").read_text()
    assert lines.count('"notify_failed"') == 1 and '"address":"' + str(tmp_path) in lines


def test_watchdog_pings_every_half_period_until_cancelled(
    tmp_path: Path, listener: tuple[socket.socket, str]
) -> None:
    sock, path = listener
    events = _events(tmp_path)
    environ = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000", "WATCHDOG_PID": str(os.getpid())}
    sd = SdNotify.from_environ(environ, os.getpid(), events)
    assert sd.watchdog_interval == 0.05

    async def pings(n: int) -> list[float]:
        task = asyncio.create_task(sd.watchdog())
        loop = asyncio.get_running_loop()
        seen = []
        try:
            for _ in range(n):
                data = await asyncio.wait_for(loop.sock_recv(sock, 64), 5.0)  # a deadline per ping
                assert data == b"WATCHDOG=1"
                seen.append(time.monotonic())
        finally:
            task.cancel()
            sd.close()
        return seen

    sock.setblocking(False)
    seen = asyncio.run(pings(6))
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    # five periods between the first and the last ping: never much faster than the period
    # asks (a late first receipt on a busy machine may hide up to two), nor much slower
    assert 3 * 0.05 <= seen[-1] - seen[0] < 5 * 0.05 + 1.0, gaps
    events.close()


def test_no_watchdog_for_another_process(tmp_path: Path) -> None:
    events = _events(tmp_path)
    environ = {"NOTIFY_SOCKET": "/nonexistent", "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"}
    assert SdNotify.from_environ(environ, os.getpid() + 1, events).watchdog_interval is None
    for bad in ("", "0", "-5", "soon"):
        environ = {"NOTIFY_SOCKET": "/nonexistent", "WATCHDOG_USEC": bad}
        assert SdNotify.from_environ(environ, os.getpid(), events).watchdog_interval is None
    events.close()
