"""When standbys start, driven in-process on virtual time (issue 13, item 1): once every
rank of the running generation has stepped, or STANDBY_SETTLE seconds after the go for
ranks that report no steps; never beside the generation's start-up. Their priority
(SCHED_IDLE, setpriv) stays real: tests/integration/test_standby.py."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

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
