"""Standby ranks never slow the generation that runs (issue 13, item 1).

A standby starts once every rank of the running generation has stepped (or 5 s
after the go, for ranks that report no steps): beside a generation's start-up it
slowed it, even at idle priority. It preloads at SCHED_IDLE where it may come back
from it, and is hurried to normal priority when its go comes before its preload is
over. A go that comes during the preload ends it: the program imports what it needs
itself. (Those two are about spawned ranks, which preload themselves: a rank forked
from the fork server is ready at birth; tests/integration/test_fork_server.py.)
When standbys start, on virtual time: tests/fast/test_standby_fast.py.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.process.bootstrap import may_leave_idle
from tests.support import RANKS, Daemon, rank_pids, wait_until

BEHAVE = str(RANKS / "behave.py")
FAST = ("--nproc-per-node", "2", "--max-restarts", "2")
Start = Callable[..., Daemon]
# the daemon without CAP_SYS_NICE, as a job under a scheduler runs (RLIMIT_NICE stays 0)
UNPRIVILEGED = ("setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice")


def _policies(pid: int) -> set[int]:
    """The scheduling policy of every thread of ``pid``."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found.add(os.sched_getscheduler(int(tid)))
        except OSError:
            continue  # the thread ended meanwhile
    return found


@pytest.mark.skipif(not may_leave_idle(), reason="needs CAP_SYS_NICE (or RLIMIT_NICE 20) to leave SCHED_IDLE")
@pytest.mark.slow
def test_a_standby_preloads_at_idle_priority_and_is_hurried_when_needed_early(
    start: Start, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    env = {**os.environ, "FT_TEST_PRELOAD_GATE": str(gate)}
    # spawned standbys: each preloads itself (a forked one has it from the fork server)
    d = start(*FAST, "--no-fork-server", "--preload", "slow_preload", BEHAVE, "--forever", "--step", env=env)
    standbys = [e["pid"] for e in d.wait_event("rank_spawned", where=lambda e: e["generation"] == 1, count=2)]
    # both standbys are inside their preload, spinning
    wait_until(lambda: all(Path(f"{gate}.{pid}.in").exists() for pid in standbys), 30, "standbys preloading")
    assert all(_policies(pid) == {os.SCHED_IDLE} for pid in standbys)
    os.kill(rank_pids(d, 0)[1], signal.SIGKILL)
    started = d.wait_event("generation_started", where=lambda e: e["generation"] == 1)[0]
    assert started["standby_ranks"] == 2 and started["standby_ready"] == 0
    # needed before it was ready: it finishes its preload at normal priority, every thread
    wait_until(lambda: all(_policies(pid) == {os.SCHED_OTHER} for pid in standbys), 10, "standbys hurried")
    assert not gate.exists() and not d.events("standby_ready")  # hurried while still preloading
    gate.touch()
    d.wait_event("standby_ready", where=lambda e: e["generation"] == 2)
    assert d.events("standby_ready")[-1]["priority"] == "idle"
    d.signal(signal.SIGTERM)
    assert d.wait() == 128 + signal.SIGTERM, d.story()


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_without_cap_sys_nice_standbys_preload_at_normal_priority(start: Start) -> None:
    # when they start (every rank stepped, or STANDBY_SETTLE for ranks that report no
    # steps) is in tests/fast/test_standby_fast.py; here, only what setpriv takes away:
    # the ranks report a step, so the standbys start without the settling wait
    d = start(*FAST, "--preload", "none", BEHAVE, "--forever", "--step", prefix=UNPRIVILEGED)
    ready = d.wait_event("standby_ready", timeout=30)[0]
    assert ready["priority"] == "normal"
    assert all(_policies(pid) == {os.SCHED_OTHER} for pid in rank_pids(d, 1))
    d.signal(signal.SIGTERM)
    assert d.wait() == 128 + signal.SIGTERM, d.story()


def test_a_go_during_the_preload_ends_it(start: Start, tmp_path: Path) -> None:
    mark = tmp_path / "late"
    env = {**os.environ, "FT_TEST_PRELOAD_MARK": str(mark)}
    d = start("--nproc-per-node", "2", "--no-fork-server", "--preload", "go_preload,late_preload", BEHAVE,
              "--print", "ran", env=env)  # fmt: skip
    assert d.wait(timeout=60) == 0, d.story()
    assert "[rank 0] ran\n" in d.stdout() and "[rank 1] ran\n" in d.stdout()
    assert not list(tmp_path.glob("late.*"))  # the go came first: the rest was never imported
