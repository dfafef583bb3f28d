"""The whole daemon through its CLI, with light (torch-free) ranks: what needs real processes
(logs and consoles, signals, exec modes, priorities, leaks). Decisions, timings and state
transitions of the lifecycle run in-process on virtual time: tests/fast/test_lifecycle_fast.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.process.sentinel import pids_with_env
from supervisor.runtime.lifecycle.launcher import IDLE_STANDBYS
from tests.support import LEAK_KEY, RANKS, Daemon, Timeout, alive, proc_state, rank_pids, wait_until

BEHAVE = str(RANKS / "behave.py")
FAST = ("--nproc-per-node", "2", "--preload", "none")
Start = Callable[..., Daemon]


def test_clean_run_exits_0_with_logs_and_events(start: Start) -> None:
    d = start(*FAST, BEHAVE, "--print", "hello")
    assert d.wait() == 0, d.story()
    assert "[rank 0] hello\n" in d.stdout() and "[rank 1] hello\n" in d.stdout()
    assert "[rank 1] err:hello\n" in d.stderr()
    run_dir = d.run_dir()
    assert run_dir is not None
    for r in (0, 1):
        files = run_dir / "gen_0" / f"local_rank_{r}"
        assert (files / "stdout.log").read_text() == "hello\n"
        assert (files / "stderr.log").read_text() == "err:hello\n"
    names = [e["event"] for e in d.events()]
    assert names[0] == "run_started" and names[-1] == "run_finished"
    for name, count in [
        ("rank_spawned", 2),
        ("generation_started", 1),
        ("rank_exited", 2),
        ("generation_ended", 1),
    ]:
        assert names.count(name) == count, names
    assert d.events("run_finished")[0]["exit_code"] == 0
    assert all("t_mono" in e and "t_wall" in e for e in d.events())


def test_console_follows_redirects_tee_and_filters(start: Start) -> None:
    d = start(*FAST, "--redirects", "3", "--tee", "0:2", "--local-ranks-filter", "0", BEHAVE, "--print", "x")
    assert d.wait() == 0, d.story()
    assert "[rank" not in d.stdout()  # stdout redirected for both ranks
    assert "[rank 0] err:x" in d.stderr()  # rank 0's stderr is tee'd
    assert "[rank 1]" not in d.stderr()  # rank 1 is filtered out
    run_dir = d.run_dir()
    assert run_dir is not None
    assert (run_dir / "gen_0" / "local_rank_1" / "stdout.log").read_text() == "x\n"


def test_sigterm_stops_ranks_gracefully_and_exits_143(start: Start, tmp_path: Path) -> None:
    terms = tmp_path / "terms"
    d = start(
        *FAST,
        "--shutdown-timeout",
        "5",
        BEHAVE,
        "--forever",
        "--on-term",
        str(terms),
        "--pidfile",
        str(tmp_path),
    )
    wait_until(lambda: len(list(tmp_path.glob("rank*.pid"))) == 2, 30, "both ranks to run")
    d.signal(signal.SIGTERM)
    assert d.wait() == 128 + signal.SIGTERM
    assert sorted(terms.read_text().splitlines()) == ["0 0", "1 0"]
    assert d.events("stop_requested")[0]["signal"] == "SIGTERM"
    assert d.events("generation_ended")[0]["result"] == "stopped"


@pytest.mark.parametrize("containment", [(), ("--no-cgroups",)], ids=["cgroups-if-any", "fallback"])
def test_sigkilled_daemon_leaves_no_rank_or_grandchild(
    start: Start, tmp_path: Path, containment: tuple[str, ...]
) -> None:
    d = start(*FAST, *containment, "--max-restarts", "1", BEHAVE, "--forever", "--step",
              "--grandchild", str(tmp_path))  # fmt: skip
    wait_until(lambda: len(list(tmp_path.glob("*.children"))) == 2, 30, "the grandchildren")
    standbys = d.wait_event("rank_spawned", where=lambda e: e["standby"], count=2)
    pids = rank_pids(d) + [int(p) for f in tmp_path.glob("*.children") for p in f.read_text().split()]
    assert len(pids) == 8 and all(alive(p) for p in pids)
    assert {e["pid"] for e in standbys} <= set(pids)
    d.signal(signal.SIGKILL)
    d.wait()
    wait_until(lambda: not any(alive(p) for p in pids), 10, "every rank and descendant to die")
    if containment:
        (held,) = d.events("containment")
        assert held == {**held, "mode": "fallback", "why": "--no-cgroups was given"}, held


def test_no_python_and_module_modes(start: Start, tmp_path: Path) -> None:
    d = start("--nproc-per-node", "2", "--no-python", "sh", "-c", 'echo "sh rank $RANK"')
    assert d.wait() == 0, d.story()
    assert "[rank 1] sh rank 1" in d.stdout()
    pkg = tmp_path / "mod_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text("import os; print('module rank', os.environ['RANK'], __name__)")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    m = start("--preload", "none", "-m", "mod_pkg.job", env=env)
    assert m.wait() == 0, m.stderr()
    assert "[rank 0] module rank 0 __main__" in m.stdout()


@pytest.mark.skipif(not IDLE_STANDBYS, reason="standbys preload at normal priority here (no CAP_SYS_NICE)")
def test_a_released_standby_leaves_idle_priority_even_before_it_runs(start: Start) -> None:
    """A ready standby waits for its go at SCHED_IDLE; the daemon puts it back to
    SCHED_OTHER when it releases it, not the standby itself once it has read the go:
    on a busy node an idle-priority process may wait seconds for the CPU it needs to
    read it (CI: a twenty-cycle test waited 60 s for a released standby). Stopped
    here, so that only the daemon can have done it."""
    d = start(*FAST, "--max-restarts", "1", BEHAVE, "--forever", "--step")
    d.wait_event("standby_ready", where=lambda e: e["generation"] == 1)
    standbys = rank_pids(d, 1)
    assert len(standbys) == 2
    assert all(os.sched_getscheduler(pid) == os.SCHED_IDLE for pid in standbys)
    for pid in standbys:
        os.kill(pid, signal.SIGSTOP)
    try:
        os.kill(rank_pids(d, 0)[1], signal.SIGKILL)
        d.wait_event("generation_started", where=lambda e: e["generation"] == 1)
        # the daemon announces the generation, then releases its ranks: on a busy node
        # the test can read the event before the daemon's next lines run (CI did)
        wait_until(
            lambda: [os.sched_getscheduler(pid) for pid in standbys] == [os.SCHED_OTHER] * 2,
            10,
            "both stopped standbys back at SCHED_OTHER (only the daemon can have done it)",
        )
    finally:
        for pid in standbys:
            os.kill(pid, signal.SIGCONT)
    d.signal(signal.SIGTERM)
    assert d.wait() == 128 + signal.SIGTERM


def _footprint(daemon: int) -> dict[str, int]:
    """What a leak would grow: the daemon's open fds, threads and resident memory, and
    every process the test owns (they all carry its leak token: daemon, ranks, standbys)."""
    status = Path(f"/proc/{daemon}/status").read_text()
    rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    token = f"{LEAK_KEY}={os.environ[LEAK_KEY]}".encode()
    return {
        "fds": len(os.listdir(f"/proc/{daemon}/fd")),
        "threads": len(os.listdir(f"/proc/{daemon}/task")),
        "rss_kb": rss_kb,
        "processes": len(pids_with_env(token)),
    }


CYCLES = 12  # the settled cycles (1-4) and the last five are apart: a leak a cycle shows


@pytest.mark.slow
def test_consecutive_crash_restart_cycles_leak_nothing(start: Start, tmp_path: Path) -> None:
    """Crash/restart cycles in a row, each through a released standby, and no leak: once
    generation 0 is behind, the daemon holds no more fds or threads, no more processes
    run, no earlier rank is left a zombie, and its memory barely moves, however many
    cycles it has seen.

    The decisions and standby counts of twenty cycles are tests/fast/test_lifecycle_fast.py's;
    real torch ranks crashing and restarting are in tests/integration/test_torch_ranks.py."""
    pids, go = tmp_path / "pids", tmp_path / "go"
    pids.mkdir()
    d = start(
        *FAST,
        "--max-restarts",
        str(CYCLES),
        # every generation crashes at its first step: a crash loop by design here (the
        # ranks report an iteration), so the loop detector would rightly abort it
        "--ft-max-no-progress-cycles",
        "0",
        BEHAVE,
        "--pidfile",
        str(pids),
        "--step",
        "--wait-for",
        str(go),
        "--fail-rank",
        "1",
        "--fail-generations",
        f"0-{CYCLES - 1}",
        "--exit",
        "3",
        "--peers-wait",  # rank 0 waits to be stopped, as a peer in a collective would
    )
    footprints = []
    for gen in range(CYCLES + 1):
        try:
            wait_until(lambda g=gen: all((pids / f"rank{r}.gen{g}.pid").exists() for r in (0, 1)), 60,
                       f"generation {gen}'s ranks to be ready")  # fmt: skip
        except Timeout:  # what the daemon did instead (CI once waited here for generation 6)
            raise AssertionError(d.story()[-6000:]) from None
        if gen < CYCLES:  # the next generation's standbys, spawned once both ranks stepped
            d.wait_event("rank_spawned", 60, where=lambda e, g=gen: e["standby"] and e["generation"] == g + 1,
                         count=2)  # fmt: skip
            footprints.append(_footprint(d.pid))
        for old in range(gen):  # every earlier rank is gone, and reaped (no zombie)
            for r in (0, 1):
                assert proc_state(int((pids / f"rank{r}.gen{old}.pid").read_text())) is None, (old, r)
        (tmp_path / f"go{gen}").touch()
    assert d.wait(60) == 0, d.story()[-3000:]
    assert len(d.events("generation_started")) == CYCLES + 1
    settled, last = footprints[1:5], footprints[-5:]
    for key in ("fds", "threads", "processes"):
        assert max(f[key] for f in last) <= max(f[key] for f in settled), (key, footprints)
    # a leak of a few kB a cycle would pass; one of a rank's output buffers, or of its
    # event history, would not
    assert last[-1]["rss_kb"] - footprints[1]["rss_kb"] < 8 * 1024, footprints
