"""The daemon as a service: sd_notify, SIGHUP reload, signal forwarding, orphans,
and PID 1 of a container (a new PID namespace)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import RANKS, Daemon, alive, proc_state, rank_pids, unshare_pid_refused, wait_until

HOSTED = str(RANKS / "hosted.py")
FAST = ("--preload", "none")
ORPHAN_EXIT = 7
Start = Callable[..., Daemon]


class NotifyListener:
    """systemd's side of NOTIFY_SOCKET: a datagram socket read by a thread, so that
    the daemon's sends never find the queue (10 datagrams here) full."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="ftn-")  # short: sun_path holds 108 bytes
        self.path = str(Path(self._dir.name) / "notify.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        self._sock.settimeout(0.1)
        self.received: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            self.received.append((time.monotonic(), data.decode()))

    def lines(self) -> list[str]:
        return [line for _, msg in list(self.received) for line in msg.split("\n")]

    def wait_for(self, line: str, count: int = 1, timeout: float = 30.0) -> None:
        wait_until(lambda: self.lines().count(line) >= count, timeout, f"{count} x {line!r} on NOTIFY_SOCKET")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        self._dir.cleanup()


@pytest.fixture
def notify() -> Iterator[NotifyListener]:
    listener = NotifyListener()
    yield listener
    listener.close()


def _ranks_ready(d: Daemon, out: Path, n: int) -> list[dict[str, object]]:
    def ready() -> list[dict[str, object]] | None:
        files = [out / f"rank{r}.json" for r in range(n)]
        if d.proc.poll() is not None:
            raise AssertionError(f"daemon exited ({d.proc.returncode})\n{d.stderr()}")
        return [json.loads(f.read_text()) for f in files] if all(f.exists() for f in files) else None

    result: list[dict[str, object]] = wait_until(ready, 30, "the ranks to be ready")
    return result


def test_systemd_hears_ready_status_watchdog_and_stopping(
    start: Start, tmp_path: Path, notify: NotifyListener
) -> None:
    env = {**os.environ, "NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "400000"}
    d = start(*FAST, "--nproc-per-node", "2", HOSTED, str(tmp_path), env=env)
    notify.wait_for("READY=1")
    # READY follows the ranks' spawn and their go, never precedes them
    names = [e["event"] for e in d.events()]
    assert names.count("rank_spawned") == 2 and "generation_started" in names
    assert "STATUS=running generation 0 with 2 ranks" in notify.lines()
    assert all(r["env"] == [] for r in _ranks_ready(d, tmp_path, 2))  # nothing inherited the socket
    notify.wait_for("WATCHDOG=1", count=4)
    pings = [t for t, msg in notify.received if msg == "WATCHDOG=1"]
    # every half period (0.2 s), not a flood; counted, since a busy test may read them in bursts
    assert len(pings) <= (time.monotonic() - d.events("run_started")[0]["t_mono"]) / 0.2 + 2
    d.signal(signal.SIGTERM)
    notify.wait_for("STOPPING=1")
    assert d.wait() == 128 + signal.SIGTERM
    lines = notify.lines()
    assert lines.count("READY=1") == 1 and lines.count("STOPPING=1") == 1
    assert "STATUS=stopping on SIGTERM" in lines and lines[-1] == "STATUS=finished, exit code 143"
    hosting = d.events("hosting")[0]
    assert hosting["notify"] is True and hosting["watchdog_interval"] == 0.2
    assert d.events("notify_failed") == []


def test_sighup_reloads_the_config_file_and_leaves_the_ranks_alone(
    start: Start, tmp_path: Path, notify: NotifyListener
) -> None:
    """The real signals: SIGHUP reloads (systemd hears RELOADING=1 ... READY=1), SIGWINCH and
    SIGUSR2 reach the ranks. What a reload changes, and a bad file changing nothing, is
    tests/fast/test_startup.py's."""
    cfg = tmp_path / "ft.yaml"
    cfg.write_text("training:\n  fault_tolerance:\n    rank_heartbeat_timeout: 60\n")
    env = {**os.environ, "NOTIFY_SOCKET": notify.path}
    d = start(*FAST, "--nproc-per-node", "2", "--ft-cfg-path", str(cfg), HOSTED, str(tmp_path), env=env)
    pids = sorted(int(r["pid"]) for r in _ranks_ready(d, tmp_path, 2))  # type: ignore[call-overload]
    cfg.write_text("training:\n  fault_tolerance:\n    rank_heartbeat_timeout: 90\n    log_level: debug\n")
    d.signal(signal.SIGHUP)
    reloaded = d.wait_event("config_reloaded")[0]
    assert reloaded["changed"] == {"rank_heartbeat_timeout": {"from": 60.0, "to": 90.0}}
    notify.wait_for("READY=1", count=2)  # RELOADING=1 ... READY=1 around it
    assert "RELOADING=1" in notify.lines()

    # the file's log_level is NVRx's: a forwarded SIGWINCH (a DEBUG event) stays off the console,
    # handled before the SIGUSR2 sent after it reaches the ranks
    d.signal(signal.SIGWINCH)
    d.signal(signal.SIGUSR2)
    wait_until(lambda: all((tmp_path / f"usr2.{r}").exists() for r in (0, 1)), 30, "SIGUSR2 at every rank")
    assert "signal_forwarded: SIGWINCH" not in d.stderr()
    assert [e["signal"] for e in d.events("signal_forwarded")][:1] == ["SIGWINCH"]

    assert sorted(rank_pids(d)) == pids and all(alive(p) for p in pids)  # the same ranks throughout
    assert d.events("stop_requested") == [] and d.events("generation_ended") == []
    (tmp_path / "release").touch()
    assert d.wait() == 0, d.story()


def _orphan(out: Path) -> tuple[int, int]:
    """The orphan's pid and its parent once reparented, as it wrote them."""
    f = out / "orphan"
    pid, parent = wait_until(lambda: f.exists() and f.read_text(), 30, "the orphan's report").split()
    return int(pid), int(parent)


def test_an_orphan_of_a_rank_comes_back_to_the_daemon_and_is_reaped(start: Start, tmp_path: Path) -> None:
    d = start(*FAST, HOSTED, str(tmp_path), "--orphan")
    pid, parent = _orphan(tmp_path)
    assert parent == d.pid  # the daemon is its subreaper: not init, not the test
    reaped = d.wait_event("orphan_reaped", timeout=15)[0]
    assert (reaped["pid"], reaped["status"]) == (pid, ORPHAN_EXIT)
    assert proc_state(pid) is None  # no zombie left (its pid is not the ranks' to recycle so soon)
    assert d.events("hosting")[0]["subreaper"] is True
    (tmp_path / "release").touch()
    assert d.wait() == 0, d.story()


def _children(pid: int) -> list[int]:
    found = []
    for f in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(p) for p in f.read_text().split()]
        except OSError:
            continue
    return found


def _inner_pid(outer: int) -> int | None:
    try:
        status = Path(f"/proc/{outer}/status").read_text()
    except OSError:
        return None
    line = next(line for line in status.splitlines() if line.startswith("NSpid:"))
    return int(line.split()[-1])  # the pid as the innermost namespace sees it


def test_as_pid_1_of_a_container_it_reaps_orphans_and_keeps_the_exit_codes(tmp_path: Path) -> None:
    why = unshare_pid_refused()
    if why is not None:
        pytest.skip(why)
    runtime = Path(tempfile.mkdtemp(prefix="ftx-"))  # its own endpoint dir: inside, every daemon is pid 1
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-m", "supervisor",
            "run", "--log-dir", str(tmp_path / "logs"), "--rdzv-id", "t", *FAST, HOSTED, str(tmp_path),
            "--orphan"]  # fmt: skip
    d = Daemon.__new__(Daemon)  # the helper's readers, around a different command line
    d.tmp, d.log_dir, d.run_id = tmp_path, tmp_path / "logs", "t"
    d.stdout_path, d.stderr_path = tmp_path / "daemon.stdout", tmp_path / "daemon.stderr"
    with d.stdout_path.open("wb") as out, d.stderr_path.open("wb") as err:
        d.proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                  cwd=tmp_path)  # fmt: skip
    try:
        daemon = wait_until(lambda: next(iter(_children(d.proc.pid)), None), 30, "the namespace's init")
        hosting = d.wait_event("hosting")[0]
        assert hosting["pid1"] is True and hosting["subreaper"] is False
        pid, parent = _orphan(tmp_path)
        assert parent == 1  # inside the namespace, orphans go to its init: the daemon
        reaped = d.wait_event("orphan_reaped", timeout=15)[0]
        assert (reaped["pid"], reaped["status"]) == (pid, ORPHAN_EXIT)
        # from outside: no zombie under the daemon (the orphan would be one, had nobody reaped it)
        zombies = [c for c in _children(daemon) if proc_state(c) == "Z"]
        assert [_inner_pid(c) for c in zombies] == []
        (tmp_path / "release").touch()
        assert d.wait() == 0, d.story()  # the contract's success, through unshare
        assert d.events("run_finished")[0]["exit_code"] == 0
    finally:
        d.close()
        shutil.rmtree(runtime, ignore_errors=True)
