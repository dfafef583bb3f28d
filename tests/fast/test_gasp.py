"""The dying gasp on virtual time: ranks with a save callback save before they are
stopped; a hung rank is not asked; a failing or slow save does not hold the stop.
The daemon's side, through tests/fast/fakes_gasp.py; the client's saver socket and
thread, once, for real: tests/integration/test_gasp.py."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from supervisor.runtime.lifecycle import signals
from supervisor.runtime.lifecycle.daemon import Supervisor
from tests.fast.fakes import Rank
from tests.fast.fakes_gasp import SaveRequest, Savers
from tests.fast.harness import Run, Watcher, supervise

Saved = dict[tuple[int, int], dict[str, Any]]


def saver(saved: Saved, *, seconds: float = 0.0, raise_rank: int | None = None):
    """The callback of tests/fixtures/ranks/saver.py: ``seconds`` of work, then what it was told."""

    async def save(r: Rank, request: SaveRequest) -> None:
        if r.rank == raise_rank:
            raise RuntimeError("disk full")
        await r.sleep(seconds)
        saved[r.rank, r.generation] = {"reason": request.reason, "deadline": request.deadline}

    return save


def workload(savers: Savers, save, *, crash_rank: int | None = None, hang_rank: int | None = None):
    """Each rank registers its callback, then heartbeats and steps; in generation 0,
    ``crash_rank`` exits 1 and ``hang_rank`` stops heartbeating (its saver could answer)."""

    async def script(r: Rank) -> int | None:
        r.hello()
        savers.register(r, save)
        await r.sleep(0.5)  # every rank registered
        if r.generation > 0:
            return 0
        if r.rank == crash_rank:
            return 1
        if r.rank == hang_rank:
            await r.hang()
        for i in range(10_000):
            r.heartbeat()
            r.send("iteration", iteration=i)
            await r.sleep(0.1)
        return 0

    return script


def stop_once_stepping(daemon: Supervisor, seen: Watcher):
    async def act() -> None:
        await seen.first("rank_stepping", generation=0, rank=0)
        await seen.first("rank_stepping", generation=0, rank=1)
        daemon.commands.queue.put_nowait(signals.Stop(signal.SIGTERM))

    return act()


def names(run: Run) -> list[str]:
    return [e["event"] for e in run.events]


def test_a_crash_asks_the_survivor_to_save_before_the_restart(tmp_path: Path) -> None:
    savers, saved = Savers(), Saved()
    script = workload(savers, saver(saved, seconds=2.0), crash_rank=1)
    run = supervise(tmp_path, script, "--max-restarts", "1", operator=savers.operator())
    assert run.code == 0, run.story()
    asked = run.one("save_requested")
    assert (asked["ranks"], asked["generation"], asked["why"]) == ([0], 0, "generation 0 failed")
    assert asked["deadline"] == 60.0
    finished = run.one("save_finished")
    assert (finished["saved"], finished["failed"], finished["unanswered"]) == ([0], None, None)
    assert finished["seconds"] == 2.0  # the save's own time, on the daemon's clock
    assert saved == {(0, 0): {"reason": "generation 0 failed", "deadline": 60.0}}  # the crashed rank: nothing
    assert [rank for rank, _ in savers.requests] == [0]
    # saved first, stopped after: the survivor is signalled only once its save is done
    order = names(run)
    assert order.index("save_finished") < order.index("generation_ended")
    survivor = next(r for r in run.ranks.of(0) if r.rank == 0)
    assert survivor.proc.signals[-1] == signal.SIGTERM and signal.SIGKILL not in survivor.proc.signals
    stopped = next(e for e in run.named("rank_exited") if (e["generation"], e["rank"]) == (0, 0))
    assert stopped["t_mono"] >= finished["t_mono"]
    assert order.count("generation_started") == 2
    assert run.decisions() == [("restart", "rank_failed")]


def test_a_hung_rank_is_not_asked_to_save(tmp_path: Path) -> None:
    savers, saved = Savers(), Saved()
    run = supervise(tmp_path, workload(savers, saver(saved), hang_rank=1),
                    "--ft-initial-rank-heartbeat-timeout", "1", "--ft-rank-heartbeat-timeout", "1",
                    operator=savers.operator())  # fmt: skip
    assert run.one("rank_hung")["rank"] == 1, run.story()
    # its state is in doubt, and it could hold the restart: its saver, alive, is not asked
    assert run.one("save_requested")["ranks"] == [0]
    assert run.one("save_finished")["saved"] == [0]
    assert set(saved) == {(0, 0)}
    assert [rank for rank, _ in savers.requests] == [0]


def test_sigterm_waits_for_the_saves_then_stops(tmp_path: Path) -> None:
    savers, saved = Savers(), Saved()
    run = supervise(tmp_path, workload(savers, saver(saved, seconds=0.5)),
                    operator=savers.operator(stop_once_stepping))  # fmt: skip
    assert run.code == 128 + signal.SIGTERM, run.story()
    finished = run.one("save_finished")
    assert finished["saved"] == [0, 1] and finished["seconds"] == 0.5
    assert saved == {(r, 0): {"reason": "stop requested (SIGTERM)", "deadline": 60.0} for r in (0, 1)}
    assert run.decisions() == []
    assert json.loads((run.rundir / "reason.json").read_text())["outcome"] == "stopped"
    # the ranks got their SIGTERM once the saves were done, not before
    stopped = [e["t_mono"] for e in run.named("rank_exited")]
    assert len(stopped) == 2 and min(stopped) >= finished["t_mono"]


def test_a_failing_or_slow_save_is_reported_and_does_not_hold_the_stop(tmp_path: Path) -> None:
    savers, saved = Savers(), Saved()
    run = supervise(tmp_path, workload(savers, saver(saved, seconds=60, raise_rank=0)), "--save-timeout", "1",
                    operator=savers.operator(stop_once_stepping))  # fmt: skip
    assert run.code == 128 + signal.SIGTERM, run.story()
    finished = run.one("save_finished")
    assert finished["saved"] == []
    assert finished["failed"] == {"0": "RuntimeError: disk full"}
    assert finished["unanswered"] == [1]
    assert finished["seconds"] == 1.0  # the deadline, exactly: the slow save did not hold the stop
    assert saved == {}
    ended = run.one("generation_ended")
    assert ended["t_mono"] - run.one("save_requested")["t_mono"] < 2.0
