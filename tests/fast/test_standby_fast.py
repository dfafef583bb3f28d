"""When standbys start, driven in-process on virtual time (issue 13, item 1): once every
rank of the running generation has stepped, or STANDBY_SETTLE seconds after the go for
ranks that report no steps; beside the generation's start-up only where the node's idle
cores cover the ranks and their standbys (issue 25, item 6). Their priority
(SCHED_IDLE, setpriv) stays real: tests/integration/test_standby.py."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from supervisor.core.standby_start import CpuRoom
from supervisor.runtime.lifecycle import signals
from supervisor.runtime.lifecycle.daemon import Supervisor
from supervisor.runtime.lifecycle.launcher import STANDBY_SETTLE
from tests.fast.fakes import Rank
from tests.fast.harness import Run, Watcher, supervise

OPTIONS = ("--max-restarts", "2")


async def stop_once_standbys_are_up(daemon: Supervisor, seen: Watcher) -> None:
    await seen.first("standby_ready", generation=1)
    daemon.commands.queue.put_nowait(signals.Stop(signal.SIGTERM))


def _standbys(run: Run) -> list[float]:
    spawned = [e["t_mono"] for e in run.named("rank_spawned") if e["generation"] == 1]
    assert len(spawned) == 2 and all(e["standby"] for e in run.named("rank_spawned") if e["generation"] == 1)
    return spawned


def test_standbys_start_once_every_rank_has_stepped(tmp_path: Path) -> None:
    async def warms_up(r: Rank) -> int | None:
        r.hello()
        # the first step takes 2 s (a warm-up, as compiling or loading data would); rank
        # 1's 0.5 s longer: the standbys wait for the last rank's first step
        await r.step(0, seconds=2.0 + 0.5 * r.rank)
        await r.train(10**6, seconds=0.01, first=1)
        return 0

    run = supervise(tmp_path, warms_up, *OPTIONS, operator=stop_once_standbys_are_up)
    assert run.code == 128 + signal.SIGTERM, run.story()
    go = run.named("generation_started")[0]["t_mono"]
    stepping = sorted(e["t_mono"] - go for e in run.named("rank_stepping") if e["generation"] == 0)
    assert stepping == pytest.approx([2.0, 2.5], abs=1e-3)
    # spawned at the last rank's first step, not before and not a settle time later
    assert [t - go for t in _standbys(run)] == pytest.approx([2.5, 2.5], abs=1e-3)


def test_standbys_of_ranks_that_report_no_steps_wait_for_the_generation_to_settle(tmp_path: Path) -> None:
    async def silent(r: Rank) -> int | None:
        r.hello()
        await r.hang()
        return None

    run = supervise(tmp_path, silent, *OPTIONS, operator=stop_once_standbys_are_up)
    assert run.code == 128 + signal.SIGTERM, run.story()
    assert not run.named("rank_stepping")
    go = run.named("generation_started")[0]["t_mono"]
    assert [t - go for t in _standbys(run)] == pytest.approx([STANDBY_SETTLE] * 2, abs=1e-3)
    assert run.one("standby_ready")["ranks"] == 2


def test_no_standbys_when_no_restart_is_left(tmp_path: Path) -> None:
    async def steps(r: Rank) -> int | None:
        r.hello()
        await r.train(20)
        return 0

    run = supervise(tmp_path, steps, "--max-restarts", "0")
    assert run.code == 0, run.story()
    assert {e["generation"] for e in run.named("rank_spawned")} == {0}
    assert not run.named("standby_ready")


# The node's CPUs as generation 0 launches (core.standby_start): idle cores for a rank
# and its standby each start them together; the rule's own cases: tests/unit/test_standby_start.py
IDLE_TWO = CpuRoom(cpus=2, online=2, load=0.0)


def test_with_idle_cores_standbys_start_with_the_generation_and_an_early_fault_restarts_warm(
    tmp_path: Path,
) -> None:
    async def crashes_before_stepping(r: Rank) -> int | None:
        r.hello()
        if r.generation == 0:
            await r.sleep(1.0)  # still starting up: no step yet
            return 1
        await r.train(2)
        return 0

    run = supervise(tmp_path, crashes_before_stepping, "--nproc-per-node", "1", *OPTIONS, room=IDLE_TWO)
    assert run.code == 0, run.story()
    go = run.named("generation_started")[0]["t_mono"]
    (spawned,) = [e for e in run.named("rank_spawned") if e["generation"] == 1]
    assert spawned["standby"] and spawned["t_mono"] - go < 0.5  # with generation 0, not after a step
    ready = run.named("standby_ready")[0]
    assert (ready["generation"], ready["start"], ready["idle_cores"]) == (1, "with_generation", 2.0)
    started = run.named("generation_started")[1]
    assert (started["standby_ranks"], started["standby_ready"]) == (1, 1)  # warm: the cost of a go


def test_two_ranks_on_two_idle_cores_keep_waiting_for_their_steps(tmp_path: Path) -> None:
    async def warms_up(r: Rank) -> int | None:
        r.hello()
        await r.step(0, seconds=2.0)
        await r.train(10**6, seconds=0.01, first=1)
        return 0

    run = supervise(tmp_path, warms_up, *OPTIONS, operator=stop_once_standbys_are_up, room=IDLE_TWO)
    go = run.named("generation_started")[0]["t_mono"]
    assert [t - go for t in _standbys(run)] == pytest.approx([2.0, 2.0], abs=1e-3)
    assert run.one("standby_ready")["start"] == "after_steps"
