"""Nothing a rank starts outlives its generation: not even a double-forked, setsid'd
grandchild that exec'd with an empty environment (no token for the sweep to find).

Such escapees are invisible to the suite's leak check (it looks for a token in the
environment), so the fixture rank writes their pids to files, the tests check those
pids against deadlines, and ``escapees`` kills any still alive at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor.process import cgroups
from supervisor.process.sentinel import remove_cgroup
from tests.support import RANKS, Daemon, alive, unshare_pid_refused, wait_until

ESCAPES = str(RANKS / "escapes.py")
FAST = ("--nproc-per-node", "2", "--preload", "none")
Start = Callable[..., Daemon]
SLEEP_CMDLINE = b"sleep\x003600\x00"


@pytest.fixture(scope="module")
def contained() -> None:
    """Skip where the daemon could not have cgroups either: it falls back, and says why."""
    found = cgroups.open_run(cgroups.run_cgroup(b"test_containment"))
    if found.cgroup is None:
        pytest.skip(f"no writable cgroup v2 here: {found.why}")
    remove_cgroup(str(found.cgroup))


def _escapee(pid: int) -> bool:
    """Alive, and still the sleep the fixture exec'd (not a stranger that got its pid)."""
    try:
        return alive(pid) and Path(f"/proc/{pid}/cmdline").read_bytes() == SLEEP_CMDLINE
    except OSError:
        return False


def _pids(where: Path, generation: int | None = None) -> list[int]:
    found = []
    for f in where.glob("escapee.*"):
        if f.suffix == ".tmp":
            continue
        _, _rank, gen, _i = f.name.split(".")
        if generation is None or int(gen) == generation:
            found.append(int(f.read_text()))
    return found


@pytest.fixture
def escapees(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "escapees"
    where.mkdir()
    try:
        yield where
    finally:
        for pid in _pids(where):
            if _escapee(pid):
                os.kill(pid, signal.SIGKILL)


def _all_of(where: Path, generation: int, count: int = 4) -> list[int]:
    """The generation's escapees (2 ranks x 2), once every one has started."""
    pids: list[int] = wait_until(
        lambda: (p := _pids(where, generation)) and len(p) == count and p, 30, f"gen {generation}'s escapees"
    )
    return pids


def _none_alive(pids: list[int], what: str) -> None:
    wait_until(lambda: not any(_escapee(p) for p in pids), 10, what)


def test_a_restart_ends_the_failed_generations_escapees(
    contained: None, start: Start, escapees: Path
) -> None:
    fail = escapees / "fail"
    d = start(*FAST, "--max-restarts", "1", ESCAPES, str(escapees), "--forever",
              "--fail-generations", "0", "--fail-when", str(fail))  # fmt: skip
    first = _all_of(escapees, 0)
    fail.touch()  # every escapee is out: now the ranks fail
    d.wait_event("generation_started", where=lambda e: e["generation"] == 1)
    _none_alive(first, "generation 0's escapees to die with it")
    second = _all_of(escapees, 1)
    # each generation has a cgroup of its own: generation 1's escapees live on (their pid
    # files are written just before they exec sleep)
    wait_until(lambda: all(_escapee(p) for p in second), 10, "generation 1's escapees to run")
    d.signal(signal.SIGUSR1)
    shown = d.wait_event("status")[0]["containment"]
    assert shown["mode"] == "cgroup" and shown["cgroup"].endswith("/gen-1"), shown
    table = subprocess.run([sys.executable, "-m", "supervisor", "status", "--pid", str(d.pid)],
                           capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    assert f"containment: cgroup {shown['cgroup']} (ended with cgroup.kill)" in table, table
    d.signal(signal.SIGTERM)
    assert d.wait() == 128 + signal.SIGTERM, d.stderr()
    _none_alive(second, "generation 1's escapees to die at the stop")
    (run,) = d.events("containment")
    assert run["mode"] == "cgroup" and run["kill"] == "cgroup.kill", run
    assert not Path(run["cgroup"]).exists()  # removed on the way out
    swept = [e["swept"] for e in d.events("generation_ended")]
    assert swept == [4, 4], swept  # the escapees, not the ranks


def test_a_normal_exit_leaves_no_escapee(contained: None, start: Start, escapees: Path) -> None:
    d = start(*FAST, ESCAPES, str(escapees))
    assert d.wait() == 0, d.story()
    _none_alive(_all_of(escapees, 0), "the escapees to die with the run")


def test_a_sigkilled_daemon_leaves_no_escapee(contained: None, start: Start, escapees: Path) -> None:
    d = start(*FAST, "--max-restarts", "1", ESCAPES, str(escapees), "--forever")
    pids = _all_of(escapees, 0)
    d.wait_event("rank_spawned", where=lambda e: e["standby"], count=2)  # generation 1's cgroup too
    (run,) = d.events("containment")
    d.signal(signal.SIGKILL)
    d.wait()
    _none_alive(pids, "the sentinel to kill the run's cgroup")
    wait_until(lambda: not Path(run["cgroup"]).exists(), 30, "the sentinel to remove the run's cgroup")


def test_a_daemon_in_another_pid_namespace_leaves_a_live_runs_cgroups_alone(contained: None) -> None:
    """A daemon starting in a container of its own (here: PID 1 of a new pid namespace,
    on the same cgroup tree) tidies the run cgroups of daemons that are gone. Ours is
    alive, but its pid means nothing in there: the new daemon's tidy-up once removed a
    live run's fresh, still empty generation cgroup, and the standby about to enter it
    failed ('cannot enter the generation's cgroup ... No such file or directory': the
    suite's twenty-cycle test, beside the PID 1 test in another worker)."""
    why = unshare_pid_refused()
    if why is not None:
        pytest.skip(why)
    run = cgroups.open_run(cgroups.run_cgroup(b"test_containment/another-namespace"))
    assert run.cgroup is not None
    busy, fresh = run.generation(0), run.generation(1)
    assert busy.cgroup is not None and fresh.cgroup is not None
    procs = str(busy.cgroup / "cgroup.procs")
    enter = f"import time\nwith open({procs!r}, 'w') as f: f.write('0')\nprint('in', flush=True)\n"
    enter += "time.sleep(60)"
    sleeper = subprocess.Popen([sys.executable, "-c", enter], stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == "in\n"
        code = ("from supervisor.process import cgroups; "
                "found = cgroups.open_run(cgroups.run_cgroup(b'test_containment/pid-1')); "
                "print(found.cgroup); from supervisor.process.sentinel import remove_cgroup; "
                "remove_cgroup(str(found.cgroup)) if found.cgroup else None")  # fmt: skip
        argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
        assert done.returncode == 0 and "ft-supervisor-1-" in done.stdout, done.stdout + done.stderr
        assert fresh.cgroup.is_dir() and busy.cgroup.is_dir()
    finally:
        sleeper.kill()
        sleeper.communicate()
        remove_cgroup(str(run.cgroup))
