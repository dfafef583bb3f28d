"""Straggler detection's pure parts: scores, hysteresis, decisions, the rank-side
timer, the wire format, the options, and where its marks go."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cli import build_parser
from supervisor.cli.control import render_status
from supervisor.client.timing import StepTimer
from supervisor.config.build import build_run_config
from supervisor.config.errors import ConfigError
from supervisor.core.health import mark_of
from supervisor.core.next_step import Basis, GenerationEnd, basis_of
from supervisor.core.stragglers import (
    Change,
    Standing,
    StragglerAction,
    StragglerSettings,
    Tracker,
    decision,
    judged,
    scored,
    scores,
)
from supervisor.core.types import Action, Decision, Reason
from supervisor.transport import schema
from supervisor.transport.schema import Dropped, DropReason

S = StragglerSettings(window=4, warmup=2, sustain=2.0, interval=1.0)


def feed(t: Tracker, per_rank: dict[int, float], steps: int) -> None:
    for _ in range(steps):
        for rank, work in per_rank.items():
            t.add(rank, work, measured=False)


def test_two_ranks_the_slower_scores_against_the_faster() -> None:
    # the plain median of two would sit halfway and hide a 1.3x rank under a 1.2 threshold
    assert scores({0: 1.0, 1: 1.3}) == {0: 1.0, 1: pytest.approx(1.3)}
    got = scores(dict.fromkeys(range(7), 1.0) | {7: 1.5})
    assert got[7] == pytest.approx(1.5) and got[0] == 1.0
    assert scores({0: 1.0}) == {}  # alone, a rank has nobody to be slower than


def test_with_other_nodes_the_job_s_typical_rank_is_a_reference_too() -> None:
    # alone on its node, rank 1 is scored against the job's ranks
    (only,) = scored({1: 1.3}, {0: 1.0, 2: 1.0}).values()
    assert only.value == pytest.approx(1.3) and only.against == "job"
    # a whole node slow: 1.0 against its own ranks, 1.3 against the job's
    got = scored({2: 1.3, 3: 1.3}, {0: 1.0, 1: 1.0})
    assert {r: (round(s.value, 2), s.against) for r, s in got.items()} == {2: (1.3, "job"), 3: (1.3, "job")}
    # a slow rank elsewhere changes nothing here
    got = scored({0: 1.0, 1: 1.0}, {2: 1.3, 3: 1.0})
    assert max(s.value for s in got.values()) == 1.0


def test_flagged_only_once_sustained_and_cleared_with_hysteresis() -> None:
    t = Tracker(S)
    feed(t, {0: 0.1, 1: 0.13}, S.warmup + S.window)
    assert t.evaluate(0.0) == []  # above, but not for long yet
    assert t.evaluate(1.0) == []
    (change,) = t.evaluate(2.0)
    assert change.detected and change.rank == 1 and change.score == pytest.approx(1.3)
    assert change.samples == S.window and change.sustained == pytest.approx(2.0)
    assert t.flagged() == [1]
    feed(t, {0: 0.1, 1: 0.115}, S.window)  # 1.15: under the threshold, over the clear level
    assert t.evaluate(10.0) == [] and t.flagged() == [1]
    feed(t, {0: 0.1, 1: 0.1}, S.window)
    assert t.evaluate(11.0) == []
    (cleared,) = t.evaluate(13.0)
    assert not cleared.detected and t.flagged() == []


def test_a_dip_below_the_threshold_starts_the_wait_again() -> None:
    s = Standing()
    s = judged(s, 1.3, 0.0, S)
    s = judged(s, 1.0, 1.5, S)
    s = judged(s, 1.3, 2.5, S)
    assert not judged(s, 1.3, 4.0, S).flagged
    assert judged(s, 1.3, 4.5, S).flagged


def test_warmup_and_evaluation_or_checkpoint_steps_do_not_count() -> None:
    t = Tracker(S)
    feed(t, {0: 0.1, 1: 5.0}, S.warmup)  # rank 1 compiles for seconds: warm-up
    feed(t, {0: 0.1, 1: 0.1}, S.window - 1)
    t.add(1, 3.0, measured=False)  # one checkpoint step on rank 1
    t.add(0, 0.1, measured=False)
    for now in range(10):
        assert t.evaluate(float(now)) == []
    assert t.flagged() == []


def test_a_rank_measured_inside_no_longer_counts_its_sections() -> None:
    t = Tracker(S)
    feed(t, {0: 0.1, 1: 0.1}, S.warmup + S.window)
    for _ in range(S.warmup + S.window):
        t.add(1, 0.05, measured=True)
        t.add(1, 0.1, measured=False)  # its step section: waits included, ignored now
    assert t.medians()[1] == pytest.approx(0.05)


def test_memory_is_bounded_by_the_window() -> None:
    t = Tracker(S)
    feed(t, {0: 0.1, 1: 0.1}, 10_000)
    assert all(len(s.values) == S.window for s in t._samples.values())


def test_decisions_follow_the_action_and_the_budget() -> None:
    c = Change(True, 1, 1.31, 0.131, 0.1, 16, 10.0)
    assert decision(c, S, 3, "n") is None  # report: the default
    restart = StragglerSettings(action=StragglerAction.RESTART)
    d = decision(c, restart, 1, "n")
    assert d is not None and d.action is Action.RESTART and d.reason is Reason.STRAGGLER
    assert "rank 1 on n" in d.detail and "1.31x" in d.detail
    assert decision(c, restart, 0, "n") is None  # no restart left: report only
    away = decision(c, StragglerSettings(action=StragglerAction.RESCHEDULE), 1, "n")
    assert away is not None and away.action is Action.RESCHEDULE
    cleared = Change(False, 1, 1.0, 0.1, 0.1, 16, 10.0)
    assert decision(cleared, restart, 1, "n") is None


def test_a_reschedule_for_a_straggler_marks_the_node_a_restart_does_not() -> None:
    away = Decision(Action.RESCHEDULE, Reason.STRAGGLER, "slow")
    mark = mark_of(away, None, None, now=1.0, run_id="r", generation=2)
    assert mark is not None and mark.kind == "straggler"
    assert mark_of(Decision(Action.RESTART, Reason.STRAGGLER, "slow"), None, None, now=1.0, run_id="r",
                   generation=2) is None  # fmt: skip


def test_a_decision_taken_while_the_ranks_ran_routes_unless_something_failed() -> None:
    d = Decision(Action.RESTART, Reason.STRAGGLER, "slow")
    assert basis_of(GenerationEnd(succeeded=False, failed=False, decided=d)) is Basis.DECIDED
    assert basis_of(GenerationEnd(succeeded=False, failed=True, decided=d)) is Basis.JUDGE


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_ddp_timer_splits_each_step_into_work_and_wait() -> None:
    sent: list[tuple[float, float]] = []
    clock = FakeClock()
    timer = StepTimer(lambda work, wait: sent.append((work, wait)), clock)
    timer.ddp = True

    def step(start: float, backward_done: float, synced: float) -> None:
        clock.now = start
        timer.bucket_ready(is_last=False)  # an early bucket while backward goes on
        clock.now = backward_done
        timer.bucket_ready(is_last=True)
        timer.bucket_done()  # the early one completes: the step is not over
        clock.now = synced
        timer.bucket_done()

    step(0.5, 0.9, 1.0)  # the first step has no beginning: not reported
    step(1.5, 1.9, 2.3)  # a period of 1.3, of which 0.4 waiting for a slower peer
    assert sent == [(pytest.approx(0.9), pytest.approx(0.4))]
    timer.tainted = True  # an evaluation ran in this one
    step(2.5, 2.9, 3.0)
    step(3.5, 3.9, 4.0)
    assert len(sent) == 2 and sent[1] == (pytest.approx(0.9), pytest.approx(0.1))
    timer.step_end()  # with DDP, the step section's end is not the step's end
    assert len(sent) == 2


def test_the_manual_timer_counts_waits_until_the_step_section_closes() -> None:
    sent: list[tuple[float, float]] = []
    clock = FakeClock()
    timer = StepTimer(lambda work, wait: sent.append((work, wait)), clock)
    timer.step_end()
    clock.now = 1.0
    timer.waited(0.25)
    timer.step_end()
    assert sent == [(0.75, 0.25)]


def _timing(**fields: object) -> schema.RankMessage:
    return schema.decode_rank_message(schema.encode("timing", rank=0, gen=0, **fields))


def test_timings_are_validated() -> None:
    assert _timing(work=0.1, wait=0) == schema.Timing(0, 0, 0.1, 0.0)
    for bad in ({"work": "fast", "wait": 0}, {"work": -1, "wait": 0}, {"work": True, "wait": 0},
                {"work": 1e9, "wait": 0}, {"work": 0.1}, {"work": None, "wait": 0.0}):  # fmt: skip
        with pytest.raises(Dropped) as caught:
            _timing(**bad)
        assert caught.value.reason is DropReason.BAD_TIMING


def _config(script: Path, *argv: str, environ: dict[str, str] | None = None) -> StragglerSettings:
    ns = build_parser().parse_args(["run", *argv, str(script)])
    return build_run_config(ns, environ or {}).stragglers


def test_options(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    default = _config(script)
    assert default.enabled and default.action is StragglerAction.REPORT and default.threshold == 1.2
    s = _config(script, "--straggler-action", "reschedule", "--straggler-threshold", "1.5",
                "--straggler-window", "8", "--straggler-sustain", "0")  # fmt: skip
    got = (s.action, s.threshold, s.clear, s.window, s.sustain)
    assert got == (StragglerAction.RESCHEDULE, 1.5, 1.25, 8, 0)
    assert not _config(script, environ={"FT_SUPERVISOR_STRAGGLER_DETECTION": "off"}).enabled
    for argv, said in ((("--straggler-threshold", "1"), "must be > 1"),
                       (("--straggler-window", "2.5"), "whole number"),
                       (("--straggler-sustain", "-1"), "cannot be negative")):  # fmt: skip
        with pytest.raises(ConfigError, match=said):
            _config(script, *argv)
    with pytest.raises(ConfigError, match="expected one of report, restart, reschedule"):
        _config(script, environ={"FT_SUPERVISOR_STRAGGLER_ACTION": "kill"})


def test_the_status_table_shows_each_rank_s_score() -> None:
    row = {"rank": 0, "local_rank": 0, "pid": 1, "state": "running"}
    status = {"run_id": "r", "pid": 1, "generation": 0, "restarts_used": 0, "max_restarts": 0,
              "uptime_s": 1.0, "run_dir": "/x", "ranks": [row | {"straggler_score": 1.0, "straggler": False},
                                         row | {"rank": 1, "straggler_score": 1.312, "straggler": True},
                                         row | {"rank": 2}]}  # fmt: skip
    lines = render_status(status).splitlines()
    assert lines[1].split()[-1] == "SLOW"
    assert [line.split()[-1] for line in lines[2:5]] == ["1.00", "1.31!", "-"]
