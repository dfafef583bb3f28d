"""The advised checkpoint interval: the formula, and the figures it is fed from events."""

from __future__ import annotations

import math
from typing import Any

import pytest

from supervisor.core.checkpoint_interval import (
    RECOVERIES,
    SAVES,
    Advice,
    Advisor,
    describe,
    optimal_interval,
)

Event = tuple[str, float, dict[str, Any]]


def _feed(a: Advisor, *events: Event) -> list[bool]:
    return [a.add(name, {"event": name, "t_mono": t, **fields}) for name, t, fields in events]


def _generation(g: int, t: float, ranks: tuple[int, ...] = (0, 1)) -> list[Event]:
    spawned = [("rank_spawned", t - 1, {"generation": g, "rank": r}) for r in ranks]
    return [*spawned, ("generation_started", t, {"generation": g})]


def _steps(g: int, t: float, ranks: tuple[int, ...] = (0, 1)) -> list[Event]:
    return [("rank_stepping", t + 0.1 * i, {"generation": g, "rank": r}) for i, r in enumerate(ranks)]


def _crash(g: int, t: float) -> Event:
    return ("rank_exited", t, {"generation": g, "rank": 1, "state": "failed", "standby": None})


def test_the_formula() -> None:
    # Ts 10 s, Tf 6000 s, Tr 600 s: 10 + sqrt(2 * 6600 * 10 + 100)
    assert optimal_interval(10, 6000, 600) == pytest.approx(10 + math.sqrt(132_100))
    assert optimal_interval(0, 6000, 600) == 0  # a free save: save all the time
    assert optimal_interval(2, 0, 0) == 4  # failing at once: Ts + sqrt(Ts^2)
    # Young's sqrt(2 Tf Ts) once Ts is small against Tf
    assert optimal_interval(1, 1e6, 0) == pytest.approx(math.sqrt(2e6), rel=1e-3)
    for bad in ((-1, 1, 1), (1, -1, 1), (1, 1, -1), (math.nan, 1, 1), (1, math.inf, 1)):
        with pytest.raises(ValueError):
            optimal_interval(*bad)


def test_no_advice_without_a_save_or_a_failure_and_it_says_which() -> None:
    a = Advisor()
    _feed(a, *_generation(0, 1.0), *_steps(0, 2.0))
    first = a.advice(10.0)
    assert first.seconds is None and first.ts is None and first.tf is None
    assert "no save measured" in first.why
    a.saved(0.5)
    second = a.advice(10.0)
    assert second.seconds is None and second.ts == 0.5 and second.tf is None
    assert "no failure seen" in second.why and "--mtbf" in second.why
    assert second.trained == pytest.approx(7.9)  # every rank stepping since 2.1


def test_a_known_run_training_failing_recovering() -> None:
    a = Advisor()
    for seconds in (0.5, 0.4, 0.6):
        a.saved(seconds)
    changed = _feed(a, *_generation(0, 1.0), *_steps(0, 2.0))
    assert not any(changed)
    # the crash: 10 s trained since rank 1 stepped at 2.1 (the last to)
    assert _feed(a, _crash(0, 12.1)) == [True]
    assert _feed(a, ("rank_exited", 12.2, {"generation": 0, "rank": 0, "state": "stopped"})) == [False]
    assert _feed(a, ("generation_ended", 12.3, {"generation": 0, "result": "failed"})) == [False]
    at_crash = a.advice(12.5)
    assert (at_crash.failures, at_crash.trained, at_crash.tf, at_crash.tr) == (1, 10.0, 10.0, None)
    assert at_crash.seconds == optimal_interval(0.5, 10.0, 0.0)  # no recovery measured yet: 0
    # generation 1: every rank stepping 1.5 s after the crash was noticed
    _feed(a, *_generation(1, 13.0))
    assert _feed(a, *_steps(1, 13.5)) == [False, True]
    advice = a.advice(23.6)  # 10 s more of training
    assert (advice.failures, advice.recoveries, advice.saves) == (1, 1, 3)
    assert advice.tr == pytest.approx(1.5)
    assert advice.trained == pytest.approx(20.0)
    assert advice.tf == pytest.approx(20.0)
    assert advice.seconds == optimal_interval(0.5, advice.tf, advice.tr)
    assert advice.why == ""


def test_a_failure_counts_once_per_generation_and_training_stops_with_it() -> None:
    a = Advisor()
    a.saved(1.0)
    _feed(a, *_generation(0, 1.0), *_steps(0, 2.0))
    hung = ("rank_hung", 5.1, {"generation": 0, "rank": 1, "kind": "heartbeat", "late_by": 0.0})
    assert _feed(a, hung, _crash(0, 6.0), _crash(0, 7.0)) == [True, False, False]
    assert a.failures == 1
    assert a.advice(100.0).trained == pytest.approx(3.0)  # not training while it restarts
    # a generation that fails before its ranks all step: a failure, no training
    _feed(a, *_generation(1, 8.0), *_steps(1, 9.0, ranks=(0,)), _crash(1, 9.5))
    assert a.failures == 2 and a.advice(100.0).trained == pytest.approx(3.0)
    assert a.advice(100.0).tf == pytest.approx(1.5)


def test_an_end_without_failure_stops_training_and_standbys_are_not_the_running_ranks() -> None:
    a = Advisor()
    _feed(a, *_generation(0, 1.0), *_steps(0, 2.0))
    # the next generation's standby ranks are spawned while generation 0 trains
    _feed(a, *(("rank_spawned", 3.0, {"generation": 1, "rank": r}) for r in (0, 1)))
    _feed(a, ("generation_ended", 5.1, {"generation": 0, "result": "succeeded"}))
    assert a.failures == 0 and a.advice(50.0).trained == pytest.approx(3.0)
    # a stepping rank of a generation that has not started yet says nothing
    _feed(a, ("rank_stepping", 6.0, {"generation": 1, "rank": 0}))
    assert a.advice(50.0).trained == pytest.approx(3.0)


def test_a_prior_counts_as_one_failure_after_that_much_training() -> None:
    a = Advisor(mtbf=3600.0)
    a.saved(10.0)
    _feed(a, *_generation(0, 1.0), *_steps(0, 2.0))
    before = a.advice(402.1)  # 400 s trained, no failure
    assert before.tf == pytest.approx(4000.0) and before.prior == 3600.0
    assert before.seconds == optimal_interval(10.0, before.tf, 0.0)
    _feed(a, _crash(0, 402.1))
    after = a.advice(500.0)
    assert after.tf == pytest.approx((400.0 + 3600.0) / 2)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            Advisor(mtbf=bad)


def test_the_median_of_recent_figures_in_bounded_memory() -> None:
    a = Advisor(mtbf=100.0)
    for _ in range(1000):
        a.saved(9.0)  # old saves, slower storage
    for _ in range(SAVES - 1):
        a.saved(1.0)
    a.saved(600.0)  # one stalled save
    advice = a.advice(0.0)
    assert advice.ts == 1.0 and advice.saves == 1000 + SAVES
    a.saved(-1.0)
    a.saved(math.nan)
    assert a.advice(0.0).saves == 1000 + SAVES  # not measures of a save
    t = 0.0
    for g in range(RECOVERIES + 5):
        _feed(a, *_generation(g, t + 1, (0,)), *_steps(g, t + 2, (0,)), _crash(g, t + 3))
        t += 10
    _feed(a, *_generation(RECOVERIES + 5, t + 1, (0,)), *_steps(RECOVERIES + 5, t + 2, (0,)))
    advice = a.advice(t + 2)
    assert advice.recoveries == RECOVERIES + 5
    assert advice.tr == pytest.approx(9.0)  # crash at +3 -> the next generation stepping at +12
    assert len(a._gens) <= 2  # generations gone are forgotten


def _advice(seconds: float | None, failures: int = 1, recoveries: int = 1) -> Advice:
    return Advice(seconds, 1.0, 10.0, 1.0, 3, failures, recoveries, 10.0, None, "" if seconds else "why")


def test_news_is_an_advice_appearing_a_failure_or_recovery_more_or_a_material_move() -> None:
    assert not _advice(None).news_after(None)
    assert _advice(10.0).news_after(None)
    assert _advice(None).news_after(_advice(10.0))
    assert not _advice(10.5).news_after(_advice(10.0))
    assert _advice(11.5).news_after(_advice(10.0))
    assert _advice(9.0 - 0.01).news_after(_advice(10.0))
    assert _advice(10.1, failures=2).news_after(_advice(10.0))
    assert _advice(10.1, recoveries=2).news_after(_advice(10.0))


def test_describe() -> None:
    a = Advisor()
    assert describe(a.advice(0.0).to_json()) == (
        "checkpoint interval: no advice yet: no save measured yet (a completed `checkpointing` section, "
        "when monitored)"
    )
    a.saved(0.25)
    _feed(a, *_generation(0, 1.0), *_steps(0, 2.0), _crash(0, 12.1))
    line = describe(a.advice(13.0).to_json())
    assert line.startswith(f"checkpoint interval: advised {optimal_interval(0.25, 10, 0):.2f} s")
    assert "Ts 0.25 s" in line and "Tf 10.00 s" in line and "1 failure(s)" in line and "Tr -" in line


def test_events_without_the_fields_it_reads_are_ignored() -> None:
    a = Advisor()
    for name in ("rank_spawned", "rank_stepping", "generation_started", "rank_exited", "rank_hung"):
        assert a.add(name, {"event": name}) is False
        assert a.add(name, {"event": name, "generation": 0}) is False
        assert a.add(name, {"event": name, "generation": 0, "t_mono": "soon", "rank": "one"}) is False
    assert a.add("rank_spawned", {"generation": 0, "t_mono": 1.0}) is False
    assert a.advice(2.0).trained == 0.0


def _restored(g: int, t: float, source: str = "memory") -> list[Event]:
    return [("snapshot_restored", t, {"generation": g, "rank": r, "step": 9, "source": source, "bytes": 1})
            for r in (0, 1)]  # fmt: skip


def test_failures_restored_from_memory_leave_the_disk_interval_to_whole_job_failures() -> None:
    a = Advisor()
    a.saved(2.0)
    _feed(a, *_generation(0, 1.0), *_steps(0, 2.0), _crash(0, 12.1))
    # generation 1 restores from the ranks' memory snapshots (once per rank; counted once)
    assert _feed(a, *_generation(1, 13.0), *_restored(1, 13.1)) == [False, False, False, True, False]
    _feed(a, *_steps(1, 13.5))
    held = a.advice(113.6)
    assert (held.failures, held.covered, held.seconds, held.tf) == (1, 1, None, None)
    assert "restored from memory snapshots" in held.why and "whole-job" in held.why
    # a failure the snapshots did not cover (restored from disk, or nothing held): it counts
    _feed(a, _crash(1, 113.6), *_generation(2, 114.0), *_restored(2, 114.1, source="disk"), *_steps(2, 114.5))
    advice = a.advice(214.6)
    assert (advice.failures, advice.covered) == (2, 1)
    assert advice.tf == pytest.approx(advice.trained)  # one failure to disk in all that training
    assert advice.seconds == optimal_interval(2.0, advice.tf, advice.tr or 0.0)
    assert "1 restored from memory, not counted" in describe(advice.to_json())
    # with a prior, the covered failures do not shorten it either
    b = Advisor(mtbf=1000.0)
    b.saved(2.0)
    _feed(b, *_generation(0, 1.0), *_steps(0, 2.0), _crash(0, 12.1))
    _feed(b, *_generation(1, 13.0), *_restored(1, 13.1))
    assert b.advice(20.0).tf == pytest.approx(10.0 + 1000.0)
