"""A rank still running --exit-grace after every other rank exited 0 (issue 22), on
virtual time: its stacks are kept, it is ended, and the run succeeds only if it had
finished its work; one still working is left to finish.

A rank's activity (CPU seconds and I/O bytes, ``supervisor.process.stacks.activity``)
is a /proc read, which a fake pid has none of: it reads None, which counts as idle
(``core.lingering.idle``: what cannot be read is ended, as it would have been). The
"left to finish" case gives the daemon the fake ranks' own figures in its place; the
/proc read itself stays real in tests/integration/test_lingering.py.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from supervisor.runtime.lifecycle import running
from tests.fast.fakes import Rank
from tests.fast.harness import supervise

OPTIONS = ("--max-restarts", "0", "--exit-grace", "1")
# faulthandler's dump of lingers.py's rank 1: an atexit handler (no <module> frame) ...
AT_EXIT = """Current thread 0x00007f95379ffb80 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/usr/lib/python3.11/threading.py", line 629 in wait
  File "/work/tests/fixtures/ranks/lingers.py", line 23 in _block_at_exit
"""
# ... and in its step, inside the program
IN_STEP = """Current thread 0x00007f95379ffb80 (most recent call first):
  File "/work/tests/fixtures/ranks/lingers.py", line 28 in train_step
  File "/work/tests/fixtures/ranks/lingers.py", line 43 in main
  File "/work/tests/fixtures/ranks/lingers.py", line 60 in <module>
"""


def lingers(how: str, *, stop_at: int = 2, save_time: float = 2.5, steps: int = 5):
    """tests/fixtures/ranks/lingers.py: every rank reports ``steps`` iterations and exits
    0, but rank 1. atexit: it reports them all, then blocks at exit; loop: it stops
    reporting at ``stop_at`` and works in its step for ever; save: it reports them all,
    then writes a final checkpoint for ``save_time`` s and exits 0."""

    async def script(r: Rank) -> int | None:
        r.hello(stack_signal=signal.SIGUSR1)
        for step in range(1, steps + 1):
            if r.rank == 1 and how == "loop" and step > stop_at:
                r.stacks = IN_STEP
                await r.hang()
            r.send("iteration", iteration=step)
            await r.sleep(0.01)
        if r.rank == 1 and how == "atexit":
            r.stacks = AT_EXIT
            await r.hang()
        if r.rank == 1 and how == "save":
            r.ranks.work = (0.0, 0)  # type: ignore[attr-defined]
            for _ in range(int(save_time / 0.1)):
                cpu, io = r.ranks.work  # type: ignore[attr-defined]
                r.ranks.work = (cpu + 0.1, io + (10 << 20))  # type: ignore[attr-defined]
                await r.sleep(0.1)
        return 0

    return script


def test_a_rank_stuck_at_exit_after_its_work_is_ended_and_the_run_succeeds(tmp_path: Path) -> None:
    run = supervise(tmp_path, lingers("atexit"), *OPTIONS)
    assert run.code == 0, run.story()
    stuck = run.one("rank_exit_stuck")
    assert (stuck["rank"], stuck["success"], stuck["after"]) == (1, True, "peers_succeeded"), stuck
    # the grace, then a window of activity (min(grace, 1 s)) found it idle, then its stacks
    assert 2.0 <= stuck["waited"] < 2.5, stuck
    # its own reports say it was done: its 5 iterations, as its peer's
    assert stuck["finished"] == "it reported its last iteration (5, as its peers)"
    assert any("_block_at_exit" in frame for frame in stuck["where"]), stuck["where"]
    assert stuck["teardown"] is True
    exited = next(e for e in run.named("rank_exited") if e["rank"] == 1)
    assert exited["signal"] == "SIGKILL"
    assert run.decisions() == []
    assert json.loads((run.rundir / "reason.json").read_text())["outcome"] == "succeeded"
    bundle = run.rundir / "gen_0" / "hang-bundle"
    manifest = json.loads((bundle / "bundle.json").read_text())
    assert [e["rank"] for e in manifest["exit_stuck"]] == [1]
    assert "_block_at_exit" in (bundle / "rank1.python.txt").read_text()


def test_a_rank_still_in_its_loop_when_its_peers_are_done_fails_the_run_and_says_why(tmp_path: Path) -> None:
    run = supervise(tmp_path, lingers("loop", stop_at=2), *OPTIONS)
    assert run.code != 0, run.story()
    stuck = run.one("rank_exit_stuck")
    assert (stuck["rank"], stuck["success"], stuck["teardown"]) == (1, False, False), stuck
    assert any("train_step" in frame for frame in stuck["where"]), stuck["where"]
    assert (stuck["iteration"], stuck["peers_iteration"], stuck["finished"]) == (2, 5, None)
    decision = run.one("decision")
    assert (decision["action"], decision["reason"]) == ("abort", "rank_hung"), decision
    assert "not past its work: its last iteration 2, its peers' 5" in decision["detail"], decision


def test_with_a_restart_left_a_rank_not_done_restarts_the_generation(tmp_path: Path) -> None:
    run = supervise(tmp_path, lingers("loop", stop_at=2), "--max-restarts", "1", "--exit-grace", "1")
    assert run.code != 0, run.story()  # generation 1 lingers the same way, with no restart left
    assert [a for a, _ in run.decisions()] == ["restart", "abort"], run.story()
    assert {r for _, r in run.decisions()} == {"rank_hung"}


def test_a_rank_still_writing_after_its_peers_left_is_left_to_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its CPU and I/O grow (10 MiB every 0.1 s, of the daemon's clock): it works."""
    by_pid: dict[int, Rank] = {}

    def activity(pid: int) -> tuple[float, int] | None:
        rank = by_pid.get(pid)
        return None if rank is None else getattr(rank.ranks, "work", None)

    monkeypatch.setattr(running, "activity", activity)
    script = lingers("save", save_time=2.5)

    async def tracked(r: Rank) -> int | None:
        by_pid[r.pid] = r
        return await script(r)

    run = supervise(tmp_path, tracked, *OPTIONS)
    assert run.code == 0, run.story()
    assert not run.named("rank_exit_stuck")
    slow = run.one("rank_exit_slow")
    assert slow["rank"] == 1 and "left to finish" in slow["detail"]
    exited = next(e for e in run.named("rank_exited") if e["rank"] == 1)
    assert (exited["exit_code"], exited["signal"]) == (0, None)
    peer = next(e for e in run.named("rank_exited") if e["rank"] == 0)
    assert exited["t_mono"] - peer["t_mono"] == pytest.approx(2.5, abs=0.05)  # its own time, not cut short
    assert [r.proc.signals for r in run.ranks.spawned if r.rank == 1] == [[]]  # never signalled


def test_a_rank_whose_activity_cannot_be_read_is_ended_as_an_idle_one(tmp_path: Path) -> None:
    """The same rank writing, but /proc says nothing of it (a fake pid): it is ended."""
    run = supervise(tmp_path, lingers("save", save_time=60), *OPTIONS)
    assert not run.named("rank_exit_slow")
    stuck = run.one("rank_exit_stuck")
    assert (stuck["rank"], stuck["success"]) == (1, True), stuck
    exited = next(e for e in run.named("rank_exited") if e["rank"] == 1)
    assert exited["signal"] == "SIGKILL"
    assert run.code == 0, run.story()
