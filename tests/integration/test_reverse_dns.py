"""The daemon says when reverse DNS would stall torch's stores, without waiting for it.

torch's store sockets look up the name of every peer that connects; a rank on
127.0.0.1 is ``::ffff:127.0.0.1`` to a store listening on ``[::]``. Here the daemon
runs in a mount namespace of its own whose /etc/hosts lacks that name and whose
name server (a UDP socket the test binds and never reads) never answers: the same
lookup then waits for the resolver's timeout, as it did on this machine's own
resolver now and then (see scripts/bench/scale.py).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor.runtime.services.reverse_dns import LOOPBACK, SLOW
from tests.support import RANKS, Daemon

BEHAVE = str(RANKS / "behave.py")
Start = Callable[..., Daemon]
TIMEOUT = 3  # the resolver's, in the namespace: each unanswered lookup waits this long


def _can_mount_privately() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "--mount", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = pytest.mark.skipif(
    not _can_mount_privately(), reason="needs root and unshare --mount (a private /etc/hosts and resolver)"
)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A name server that receives every query and answers none."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(50):  # port 53 is fixed: the address is what varies
        address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
        try:
            sock.bind((address, 53))
            break
        except OSError:
            continue
    else:
        pytest.skip("no loopback address free for a name server on port 53")
    try:
        yield address
    finally:
        sock.close()


def _namespace(tmp_path: Path, server: str, hosts: str) -> tuple[str, ...]:
    """A prefix that execs the daemon where /etc/hosts, resolv.conf and nsswitch.conf
    are the test's (the daemon keeps its pid: unshare and sh exec)."""
    files = {
        "/etc/hosts": hosts,
        "/etc/resolv.conf": f"nameserver {server}\noptions timeout:{TIMEOUT} attempts:1\n",
        "/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
    }
    mounts = []
    for i, (target, text) in enumerate(files.items()):
        source = tmp_path / f"etc-{i}"
        source.write_text(text)
        mounts.append(f'mount --bind "{source}" {target}')
    script = " && ".join(mounts) + ' && exec "$@"'
    return ("unshare", "--mount", "sh", "-c", script, "sh")


def test_a_resolver_that_never_answers_is_reported_while_the_ranks_start(
    start: Start, tmp_path: Path, silent_server: str
) -> None:
    """The lookup torch's stores make for a local rank waits on a silent name server:
    the daemon says so, with the fix, and did not hold the ranks back meanwhile."""
    prefix = _namespace(tmp_path, silent_server, "127.0.0.1 localhost\n")
    d = start("--nproc-per-node", "2", "--preload", "none", BEHAVE, "--forever", prefix=prefix)
    slow = d.wait_event("reverse_dns_slow", 60)[0]
    assert slow["address"] == LOOPBACK
    assert slow["seconds"] >= min(SLOW, TIMEOUT), slow
    assert f"'{LOOPBACK} localhost' in /etc/hosts" in slow["fix"], slow
    started = d.events("generation_started")
    assert started and started[0]["t_mono"] < slow["t_mono"], (started, slow)  # the launch did not wait
    checked = d.wait_event("reverse_dns_checked", 30)[0]
    assert [(r["address"], r["slow"]) for r in checked["lookups"]] == [(LOOPBACK, True)]
    assert "reverse_dns_slow" in d.stderr(), d.stderr()[-2000:]  # on the console, as a warning
    table = subprocess.run([sys.executable, "-m", "supervisor", "status", "--pid", str(d.pid)],
                           capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    assert f"reverse DNS: {LOOPBACK} took {slow['seconds']} s" in table, table  # and to whoever asks later
    d.signal(signal.SIGTERM)
    assert d.wait() == 128 + signal.SIGTERM


def test_a_named_loopback_is_not_reported_whatever_the_resolver(
    start: Start, tmp_path: Path, silent_server: str
) -> None:
    """The same silent name server, but /etc/hosts names the address: torch's stores
    would never ask the server, and the daemon says nothing."""
    hosts = f"127.0.0.1 localhost\n{LOOPBACK} localhost\n"
    d = start("--nproc-per-node", "2", "--preload", "none", BEHAVE, "--forever",
              prefix=_namespace(tmp_path, silent_server, hosts))  # fmt: skip
    checked = d.wait_event("reverse_dns_checked", 60)[0]
    assert [(r["address"], r["slow"], r["outcome"]) for r in checked["lookups"]] == [
        (LOOPBACK, False, "named localhost")
    ], checked
    assert not d.events("reverse_dns_slow")
    table = subprocess.run([sys.executable, "-m", "supervisor", "status", "--pid", str(d.pid)],
                           capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    assert "reverse DNS" not in table, table
    d.signal(signal.SIGTERM)
    assert d.wait() == 128 + signal.SIGTERM
