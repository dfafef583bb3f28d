"""A job on torch's etcd-v2 rendezvous, with a real three-member etcd cluster on
loopback: the rendezvous has no single point of failure, so neither may we.

etcd 3.4 serves the v2 API with --enable-v2 (Debian's etcd-server); python-etcd is the
client torch uses. Skipped, with the reason, where either is missing.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from supervisor.process.ports import free_port
from tests.support import RANKS, Daemon, wait_until

ETCD = shutil.which("etcd")
try:
    import etcd  # noqa: F401 - python-etcd, torch's etcd client
except ImportError:
    HAVE_CLIENT = False
else:
    HAVE_CLIENT = True

pytestmark = [
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.skipif(ETCD is None, reason="no etcd server (Debian: apt-get install etcd-server)"),
    pytest.mark.skipif(not HAVE_CLIENT, reason="no python-etcd (pip install python-etcd)"),
]
GATED = str(RANKS / "gated.py")


@dataclass
class Member:
    name: str
    client: int
    peer: int
    proc: subprocess.Popen[bytes] | None = None

    def get(self, path: str) -> dict[str, object]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.client}{path}", timeout=2) as r:
            return dict(json.loads(r.read()))

    def is_leader(self) -> bool:
        # A member mid-election may answer with an empty body: not (yet) the leader.
        try:
            return self.get("/v2/stats/self").get("state") == "StateLeader"
        except (OSError, ValueError):
            return False


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Member]]:
    members = [Member(f"m{i}", free_port(), free_port()) for i in range(3)]
    initial = ",".join(f"{m.name}=http://127.0.0.1:{m.peer}" for m in members)
    for m in members:
        argv = [
            str(ETCD), "--name", m.name, "--data-dir", str(tmp_path / f"etcd-{m.name}"), "--enable-v2",
            "--listen-client-urls", f"http://127.0.0.1:{m.client}",
            "--advertise-client-urls", f"http://127.0.0.1:{m.client}",
            "--listen-peer-urls", f"http://127.0.0.1:{m.peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{m.peer}",
            "--initial-cluster", initial, "--initial-cluster-state", "new",
            "--initial-cluster-token", tmp_path.name,
        ]  # fmt: skip
        with (tmp_path / f"etcd-{m.name}.log").open("wb") as log:
            m.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: sum(m.is_leader() for m in members) == 1, 60, "the etcd cluster to elect a leader")
        yield members
    finally:
        for m in members:
            if m.proc is not None and m.proc.poll() is None:
                m.proc.kill()
                m.proc.wait(10)


def node(member: Member, backend: str = "etcd-v2") -> list[str]:
    conf = "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=60"
    return [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", backend,
        "--rdzv-endpoint", f"127.0.0.1:{member.client}", "--local-addr", "127.0.0.1",
        "--rdzv-conf", conf, "--max-restarts", "3", "--no-standby", "--preload", "none",
    ]  # fmt: skip


def running(d: Daemon, generation: int) -> None:
    """The generation's ranks run: the daemon watches the store for its peers' news."""
    d.wait_event("generation_started", 90, where=lambda e: e["generation"] == generation)


@pytest.mark.timeout(240)
def test_the_job_rides_out_the_etcd_leader_dying(cluster: list[Member], start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A crash restarts both nodes; the etcd leader is killed while the ranks of the
    next generation run (every daemon looks at the store ten times a second); the
    next crash still restarts the job, which then finishes. A store error during a
    leader election is transient: it used to end a daemon with an internal error
    (etcd.EtcdException: Raft Internal Error: etcdserver: request timed out)."""
    leader = next(m for m in cluster if m.is_leader())
    follower = next(m for m in cluster if m is not leader)
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "go-0").touch()
    # torchrun's older etcd backend is served as etcd-v2: the two spellings form one job
    daemons = [
        start(*node(follower, backend), GATED, "--fail-in", "0,1", "--gate", str(gate))
        for backend in ("etcd-v2", "etcd")
    ]
    for d in daemons:
        running(d, 1)
    assert leader.proc is not None
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait(10)
    rest = [m for m in cluster if m is not leader]
    wait_until(lambda: any(m.is_leader() for m in rest), 60, "the two members left to elect a leader")
    (gate / "go-1").touch()
    codes = [d.wait(120) for d in daemons]
    assert codes == [0, 0], "\n\n".join(d.story() for d in daemons)
    for d in daemons:
        assert [e["generation"] for e in d.events("generation_started")] == [0, 1, 2], d.story()
        assert not d.events("internal_error"), d.story()
    (ignored,) = daemons[1].events("settings_ignored")
    assert [o["option"] for o in ignored["settings"]] == ["--rdzv-backend etcd"]
