"""Containment on real cgroups: a rank is in its generation's cgroup from its first
instruction, and killing the cgroup ends whatever it started, token or no token."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from supervisor.core.program import Program
from supervisor.core.topology import ENV_TOKEN, RankSlot, generation_token, token_entry
from supervisor.process import cgroups
from supervisor.process.cgroups import Containment
from supervisor.process.orphans import SENTINEL, release_generation, sweep_generation
from supervisor.process.sentinel import cgroup_pids, kill_cgroup, remove_cgroup, signal_cgroup
from supervisor.process.spawn import RankFiles, RankProcess, spawn_rank
from supervisor.process.terminate import terminate
from tests.support import RANKS, alive, wait_until

SLEEP = [sys.executable, "-c", "import time; time.sleep(3600)"]


@pytest.fixture
def run() -> Iterator[Containment]:
    """A run's cgroup of the test's own; skipped where none can be made (and why)."""
    found = cgroups.open_run(cgroups.run_cgroup(f"test/{uuid.uuid4().hex}".encode()))
    if found.cgroup is None:
        pytest.skip(f"no writable cgroup v2 here: {found.why}")
    yield found
    kill_cgroup(str(found.cgroup))
    assert remove_cgroup(str(found.cgroup), timeout=10.0)


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def _enter(cgroup: Path, pid: int) -> None:
    (cgroup / "cgroup.procs").write_text(str(pid))


def _cgroup_of(pid: int) -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line.partition("::")[2] for line in lines if line.startswith("0::"))


@pytest_asyncio.fixture
async def ranks(tmp_path: Path) -> AsyncIterator[list[RankProcess]]:
    started: list[RankProcess] = []
    yield started
    for r in started:
        if r.returncode is None:
            os.killpg(r.pid, signal.SIGKILL)
            await r.proc.wait()
        r.close_boot()


async def _spawn(
    tmp_path: Path, script: str, *args: str, containment: Containment, standby: bool = False
) -> RankProcess:
    env = dict(os.environ, RANK="0", TORCHELASTIC_RESTART_COUNT="0")
    env[ENV_TOKEN] = generation_token("tok", 0)
    program = Program("script", str(RANKS / script), args, sys.executable)
    return await spawn_rank(program, RankSlot(0, 0), env, RankFiles.under(tmp_path, 0), now=0.0,
                            standby=standby, containment=containment)  # fmt: skip


@pytest.mark.asyncio
async def test_a_standby_is_in_its_generations_cgroup_before_its_go(
    run: Containment, ranks: list[RankProcess], tmp_path: Path
) -> None:
    gen = run.generation(1)
    assert gen.cgroup is not None
    r = await _spawn(tmp_path, "behave.py", "--forever", containment=gen, standby=True)
    ranks.append(r)
    assert await asyncio.wait_for(r.ready(), 30)  # it has run the bootstrap, not the program
    assert cgroup_pids(str(gen.cgroup)) == [r.pid]
    assert (Path(cgroups.locate()) / _cgroup_of(r.pid).lstrip("/")).resolve() == gen.cgroup.resolve()


@pytest.mark.asyncio
async def test_the_sweep_kills_escapees_without_a_token_and_the_cgroup_goes(
    run: Containment, ranks: list[RankProcess], tmp_path: Path
) -> None:
    gen = run.generation(0)
    assert gen.cgroup is not None
    out = tmp_path / "escapees"
    out.mkdir()
    r = await _spawn(tmp_path, "escapes.py", str(out), "--forever", containment=gen)
    ranks.append(r)
    r.go({})
    files = [out / f"escapee.0.0.{i}" for i in range(2)]
    await asyncio.to_thread(wait_until, lambda: all(f.exists() for f in files), 30, "the escapees")
    pids = [int(f.read_text()) for f in files]
    try:
        # no token to find, once each has exec'd (it writes its pid file just before: CI
        # once read the environment it still had)
        await asyncio.to_thread(wait_until, lambda: all(Path(f"/proc/{p}/environ").read_bytes() == b""
                                                        for p in pids), 30, "the escapees' exec")  # fmt: skip
        entry = token_entry("tok", 0)
        report = await terminate([r], grace=20, kill_timeout=5, sweep=lambda: sweep_generation(entry, [r]))
        assert report.swept == 2  # the escapees; the rank is not counted
        await asyncio.to_thread(wait_until, lambda: not any(alive(p) for p in pids), 10, "the escapees")
        assert await release_generation([r], timeout=10) == {}
        assert not gen.cgroup.exists()
    finally:
        for p in pids:  # an empty environment hides them from the leak check
            if alive(p) and Path(f"/proc/{p}/cmdline").read_bytes() == b"sleep\x003600\x00":
                os.kill(p, signal.SIGKILL)


def test_without_cgroup_kill_signals_empty_the_cgroup(
    run: Containment, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    gen = run.generation(0)
    assert gen.cgroup is not None
    for _ in range(3):
        sleepers.append(subprocess.Popen(SLEEP))
        _enter(gen.cgroup, sleepers[-1].pid)
    signal_cgroup(str(gen.cgroup), timeout=10.0)
    assert cgroup_pids(str(gen.cgroup)) == []
    assert [p.wait(10) for p in sleepers] == [-signal.SIGKILL] * 3


def test_the_sentinel_kills_and_removes_the_runs_cgroup(
    run: Containment, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    assert run.cgroup is not None
    gen = run.generation(4)
    assert gen.cgroup is not None
    # no run token in its environment: only the cgroup can find it
    sleepers.append(subprocess.Popen(SLEEP, env={"PATH": os.environ.get("PATH", "")} | _leak_key()))
    _enter(gen.cgroup, sleepers[0].pid)
    sentinel = subprocess.Popen(
        [sys.executable, "-P", SENTINEL, token_entry("runC").decode(), str(run.cgroup)],
        stdin=subprocess.PIPE,
    )
    sleepers.append(sentinel)
    assert sentinel.stdin is not None
    sentinel.stdin.close()  # what the kernel does when the daemon dies
    assert sentinel.wait(30) == 0
    assert sleepers[0].wait(10) == -signal.SIGKILL
    assert not run.cgroup.exists()


def _leak_key() -> dict[str, str]:
    """The suite's leak-check token (tests/conftest.py): a leak would still be caught."""
    return {k: v for k, v in os.environ.items() if k == "FT_TEST_LEAK_TOKEN"}


@pytest.mark.asyncio
async def test_a_rank_that_cannot_enter_its_cgroup_does_not_run(
    ranks: list[RankProcess], tmp_path: Path
) -> None:
    nowhere = Containment(tmp_path / "not-a-cgroup", "cgroup.kill")
    r = await _spawn(tmp_path, "behave.py", "--forever", containment=nowhere)
    ranks.append(r)
    assert await asyncio.wait_for(r.proc.wait(), 30) == 1
    stderr = RankFiles.under(tmp_path, 0).stderr.read_text()
    assert f"cannot enter the generation's cgroup {tmp_path / 'not-a-cgroup'}" in stderr


def test_where_a_cgroup_cannot_be_used_the_fallback_says_why(tmp_path: Path) -> None:
    assert cgroups.open_run("no cgroup2 hierarchy is mounted") == Containment(
        why="no cgroup2 hierarchy is mounted"
    )
    plain = tmp_path / "ft-supervisor-1-abc"  # a directory, but no cgroup: nothing can enter it
    found = cgroups.open_run(plain)
    assert found.cgroup is None
    assert found.why is not None and "cannot move itself into" in found.why
    assert not plain.exists()  # tried, and tidied away


def test_empty_run_cgroups_of_gone_daemons_are_tidied(tmp_path: Path) -> None:
    done = subprocess.Popen(["true"])
    done.wait()  # a pid that no process has now
    ns = cgroups.pid_namespace()
    stale = tmp_path / f"ft-supervisor-{done.pid}-aaaa-{ns}"
    (stale / "gen-3").mkdir(parents=True)
    live = tmp_path / f"ft-supervisor-{os.getpid()}-bbbb-{ns}"
    live.mkdir()
    # the same dead pid in another pid namespace (another container on this cgroup tree):
    # its daemon may well be alive; and a name of an older version says no namespace
    elsewhere = tmp_path / f"ft-supervisor-{done.pid}-dddd-{int(ns) + 1}"
    (elsewhere / "gen-1").mkdir(parents=True)
    legacy = tmp_path / f"ft-supervisor-{done.pid}-eeee"
    legacy.mkdir()
    cgroups.open_run(tmp_path / f"ft-supervisor-{os.getpid()}-cccc-{ns}")
    assert not stale.exists()
    assert live.exists() and (elsewhere / "gen-1").exists() and legacy.exists()
