"""The goodput ledger, pure: synthetic events with injected times, and its invariants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.goodput import Ledger, Summary
from supervisor.runreport.reader import DaemonRun, parse_lines, sessions

Event = tuple[str, dict[str, Any]]


def ev(name: str, t: float, **fields: Any) -> Event:
    return name, {"event": name, "t_wall": t, "t_mono": t, "run_id": "t", **fields}


def feed(events: list[Event], now: float | None = None) -> Summary:
    ledger = Ledger()
    for name, record in events:
        ledger.add(name, record)
    return ledger.summary(now)


def generation(g: int, start: float, step: tuple[float, float] | None, ranks: int = 2) -> list[Event]:
    out = [ev("rank_spawned", start - 0.5, generation=g, rank=r, standby=g > 0) for r in range(ranks)]
    out.append(ev("generation_started", start, generation=g))
    if step is not None:
        out += [ev("rank_stepping", step[r % 2], generation=g, rank=r, iteration=0) for r in range(ranks)]
    return out


def crash(g: int, t: float, rank: int = 1, iteration: int | None = None) -> list[Event]:
    return [
        ev("rank_exited", t, generation=g, rank=rank, state="failed", exit_code=1, signal=None),
        ev("rank_exited", t + 0.1, generation=g, rank=1 - rank, state="stopped", signal="SIGTERM"),
        ev("generation_ended", t + 0.2, generation=g, result="failed", iteration=iteration),
        ev("decision", t + 0.3, generation=g, action="restart", reason="rank_failed", rule="P9",
           rank=rank, detail=f"rank {rank}: boom"),
    ]  # fmt: skip


def saved(g: int, t: float, iteration: int, rank: int = 0) -> Event:
    return ev("checkpoint_reported", t, generation=g, rank=rank, checkpoint="saved", iteration=iteration)


def success(g: int, t: float, iteration: int | None = None) -> list[Event]:
    return [
        ev("rank_exited", t, generation=g, rank=0, state="succeeded", exit_code=0),
        ev("rank_exited", t, generation=g, rank=1, state="succeeded", exit_code=0),
        ev("generation_ended", t + 0.1, generation=g, result="succeeded", iteration=iteration),
    ]


def balanced(s: Summary) -> None:
    assert s.goodput is None if not s.steps_known else 0.0 <= s.goodput <= 1.0
    assert s.productive + s.lost <= s.wall + 1e-6
    assert s.productive + s.lost + s.overhead == pytest.approx(s.wall, abs=1e-6)


def test_a_crash_after_a_checkpoint() -> None:
    events = [
        ev("run_started", 0.0),
        *generation(0, 1.0, (2.0, 2.5)),
        saved(0, 5.0, iteration=10),
        *crash(0, 8.0, iteration=16),
        *generation(1, 8.4, (9.5, 10.0)),
        *success(1, 20.0, iteration=40),
        ev("run_finished", 20.5, exit_code=0),
    ]
    s = feed(events)
    assert (s.wall, s.generations, s.restarts, s.checkpoints, s.last_iteration) == (20.5, 2, 1, 1, 40)
    (i,) = s.incidents
    assert (i.generation, i.sign, i.rank, i.action, i.reason, i.rule) == (0, "rank_exited", 1, "restart",
                                                                          "rank_failed", "P9")  # fmt: skip
    assert (i.failed_at, i.noticed_at, i.detection) == (8.0, 8.0, 0.0)
    assert i.restart == pytest.approx(2.0)  # noticed at 8.0, every rank of gen 1 stepping at 10.0
    assert i.recomputation == pytest.approx(3.0)  # the checkpoint at 5.0 to the crash at 8.0
    assert (i.checkpoint_at, i.iterations_lost) == (5.0, 6)
    # gen 0 trained 2.5 -> 5.0 for good, gen 1 10.0 -> 20.1
    assert s.productive == pytest.approx(2.5 + 10.1)
    assert s.overhead == pytest.approx(2.5 + 0.4)  # the start-up and the end of the run
    assert s.goodput == pytest.approx(12.6 / 20.5)
    balanced(s)



def test_a_restore_from_memory_snapshots_loses_only_the_steps_since_the_snapshot() -> None:
    # gen 0 steps 0..16 from 2.5 to 8.0 (17 iterations in 5.5 s); the disk checkpoint is at 10;
    # gen 1 restores step 15 from the ranks' memory: one iteration done again, not six
    restored = [ev("snapshot_restored", 9.0, generation=1, rank=r, step=15, source="memory", bytes=1)
                for r in (0, 1)]  # fmt: skip
    events = [
        ev("run_started", 0.0),
        *generation(0, 1.0, (2.0, 2.5)),
        saved(0, 5.0, iteration=10),
        *crash(0, 8.0, iteration=16),
        *generation(1, 8.4, (9.5, 10.0)),
        *restored,
        *success(1, 20.0, iteration=40),
        ev("run_finished", 20.5, exit_code=0),
    ]
    (i,) = feed(events).incidents
    assert i.iterations_lost == 1
    assert i.recomputation == pytest.approx(5.5 / 17)  # one iteration at the generation's pace
    balanced(feed(events))
    # restored from disk (or an older snapshot than the checkpoint): the checkpoint counts
    older = [ev(n, r["t_wall"], **{**r, "step": 3}) for n, r in restored]
    from_disk = [e for e in events if e[0] != "snapshot_restored"]
    for run in (from_disk, [*from_disk[:-2], *older, *from_disk[-2:]]):
        (j,) = feed(run).incidents
        assert (j.iterations_lost, j.recomputation) == (6, pytest.approx(3.0))

def test_a_hang_is_dated_at_the_ranks_last_sign_of_life() -> None:
    events = [
        ev("run_started", 0.0),
        *generation(0, 0.5, (1.0, 1.0)),
        saved(0, 4.0, iteration=30),
        ev("rank_hung", 12.0, generation=0, rank=1, kind="heartbeat", open_for=3.0, timeout=3.0),
        ev("rank_exited", 12.5, generation=0, rank=1, state="stopped", signal="SIGKILL"),
        ev("generation_ended", 12.6, generation=0, verdict="stopped", iteration=80),
        ev("decision", 12.7, generation=0, action="restart", reason="rank_hung", rule="HANG", rank=1),
        *generation(1, 12.8, (14.0, 14.0)),
        *success(1, 30.0),
        ev("run_finished", 30.2),
    ]
    (i,) = feed(events).incidents
    assert (i.sign, i.failed_at, i.noticed_at) == ("rank_hung", 9.0, 12.0)
    assert i.detection == pytest.approx(3.0)
    assert i.recomputation == pytest.approx(5.0)  # checkpoint at 4.0 to the last sign of life at 9.0
    assert i.restart == pytest.approx(2.0)
    assert i.iterations_lost == 50
    balanced(feed(events))


def test_without_a_checkpoint_the_whole_generation_is_computed_again() -> None:
    events = [
        ev("run_started", 0.0),
        *generation(0, 1.0, (3.0, 4.0)),
        *crash(0, 10.0, iteration=20),
        *generation(1, 10.5, (12.0, 12.0)),
        *success(1, 15.0),
        ev("run_finished", 15.2),
    ]
    s = feed(events)
    (i,) = s.incidents
    assert i.recomputation == pytest.approx(6.0)  # every rank stepping at 4.0 until the crash
    assert (i.checkpoint_at, i.iterations_lost) == (None, 21)  # iterations 0..20
    assert s.productive == pytest.approx(15.1 - 12.0)
    balanced(s)


def test_a_checkpoint_of_an_earlier_generation_counts_from_this_ones_first_step() -> None:
    events = [
        ev("run_started", 0.0),
        *generation(0, 1.0, (2.0, 2.0)),
        saved(0, 3.0, iteration=5),
        *crash(0, 4.0),
        *generation(1, 4.5, (6.0, 6.0)),
        *crash(1, 9.0),
        *generation(2, 9.5, (11.0, 11.0)),
        *success(2, 12.0),
        ev("run_finished", 12.2),
    ]
    s = feed(events)
    assert [i.recomputation for i in s.incidents] == pytest.approx([1.0, 3.0])
    assert s.restarts == 2
    balanced(s)


def test_ranks_that_never_report_steps_are_measured_from_their_start_and_claim_no_goodput() -> None:
    events = [
        ev("run_started", 0.0),
        *generation(0, 1.0, None),
        *crash(0, 5.0),
        *generation(1, 5.5, None),
        *success(1, 9.0),
        ev("run_finished", 9.2),
    ]
    s = feed(events)
    (i,) = s.incidents
    assert i.restart == pytest.approx(0.5)  # to every rank started: when they stepped is unknown
    assert i.recomputation == pytest.approx(4.0)
    assert s.productive == pytest.approx(3.6)  # the ranks' running time, start-up included
    assert not s.steps_known and s.goodput is None  # so not called goodput
    balanced(s)


def test_a_generation_that_fails_before_its_first_step_is_all_downtime() -> None:
    events = [
        ev("run_started", 0.0),
        *generation(0, 1.0, (2.0, 2.0)),
        *crash(0, 5.0),
        *generation(1, 5.5, None),  # its ranks crash while starting up
        *crash(1, 7.0),
        *generation(2, 7.5, (8.0, 8.0)),
        *success(2, 9.0),
        ev("run_finished", 9.2),
    ]
    first, second = feed(events).incidents
    assert first.restart == pytest.approx(2.0)  # from 5.0 until gen 1 failed at 7.0
    assert second.recomputation == 0.0
    assert second.restart == pytest.approx(1.0)
    balanced(feed(events))


def test_a_run_that_aborts_has_no_restart() -> None:
    events = [
        ev("run_started", 0.0),
        *generation(0, 1.0, (2.0, 2.0)),
        *crash(0, 5.0)[:3],
        ev("decision", 5.3, generation=0, action="abort", reason="not_retryable", rule="P1", rank=1),
        ev("run_finished", 6.0, exit_code=2),
    ]
    s = feed(events)
    (i,) = s.incidents
    assert (i.action, i.restart, i.recomputation) == ("abort", None, pytest.approx(3.0))
    assert (s.restarts, s.generations) == (0, 1)
    assert s.overhead == pytest.approx(2.0 + 1.0)
    balanced(s)


def test_an_adopted_decision_keeps_the_root_cause_and_takes_the_jobs_action() -> None:
    events = [
        ev("run_started", 0.0),
        *generation(0, 1.0, (2.0, 2.0)),
        *crash(0, 5.0),
        ev("job_decision", 5.4, generation=0, action="abort"),
        ev("decision", 5.5, generation=0, action="abort", reason="peer_failed", rule=None, rank=None),
        ev("run_finished", 6.0, exit_code=2),
    ]
    (i,) = feed(events).incidents
    assert (i.action, i.reason, i.rule, i.rank) == ("abort", "rank_failed", "P9", 1)


def test_the_live_gauge_counts_a_restart_under_way() -> None:
    events = [
        ev("run_started", 0.0),
        *generation(0, 1.0, (2.0, 2.0)),
        *crash(0, 5.0),
        *generation(1, 5.5, None),
    ]
    ledger = Ledger()
    for name, record in events:
        ledger.add(name, record)
    s = ledger.summary(now_wall=7.0)
    assert not s.finished and s.wall == 7.0
    (i,) = s.incidents
    assert i.restart == pytest.approx(2.0)  # still restarting: gen 1 has not stepped
    assert (s.productive, i.recomputation) == (0.0, pytest.approx(3.0))  # no checkpoint
    ledger.add(*ev("rank_stepping", 7.5, generation=1, rank=0))
    ledger.add(*ev("rank_stepping", 8.0, generation=1, rank=1))
    later = ledger.summary(now_wall=10.0)
    assert later.incidents[0].restart == pytest.approx(3.0)
    assert later.productive == pytest.approx(2.0)
    assert later.goodput > s.goodput
    balanced(later)


def test_a_workload_without_steps_reads_as_training_while_it_runs() -> None:
    events = [ev("run_started", 0.0), *generation(0, 1.0, None)]
    s = feed(events, now=11.0)
    assert s.productive == pytest.approx(10.0)
    assert s.goodput is None  # running, not known to be training
    stepped = feed([*events, ev("rank_stepping", 3.0, generation=0, rank=0, iteration=1)], now=11.0)
    assert stepped.steps_known and stepped.goodput == pytest.approx(8.0 / 11.0)


def test_a_standbys_death_and_unknown_events_are_not_failures() -> None:
    events = [
        ev("run_started", 0.0),
        *generation(0, 1.0, (2.0, 2.0)),
        ev("rank_exited", 3.0, generation=1, rank=0, state="failed", standby=True),
        ev("checkpoint_synced", 3.5, files=3, bytes=1000, seconds=0.2, dest="s3://x"),
        ev("something_new", 3.6, generation="zero", rank=None),
        ("rank_stepping", {"event": "rank_stepping", "generation": 0}),  # no time: ignored
        *success(0, 4.0),
        ev("run_finished", 4.2),
    ]
    s = feed(events)
    assert s.incidents == ()
    assert s.productive == pytest.approx(2.1)
    balanced(s)


def test_nothing_fed_is_an_empty_summary() -> None:
    s = Ledger().summary(now_wall=5.0)
    assert (s.wall, s.goodput, s.generations, s.restarts, s.incidents) == (0.0, None, 0, 0, ())


def test_a_truncated_or_malformed_line_is_skipped_and_said() -> None:
    path = Path("events.jsonl")
    lines = [
        b'{"event":"run_started","t_wall":1.0}',
        b'{"event":"generation_started","t_wall":2.0,"generation":0}',
        b"",
        b"[1, 2]",
        b'{"t_wall":3.0}',
        b'{"event":"rank_exited","t_wall":3.0,"gene',
    ]
    events, skipped = parse_lines(lines, path)
    assert [e["event"] for e in events] == ["run_started", "generation_started"]
    assert [(s.line, s.why) for s in skipped] == [
        (4, "not an event (no event name or t_wall)"),
        (5, "not an event (no event name or t_wall)"),
        (6, "truncated"),
    ]


def test_daemon_runs_that_overlap_are_one_session_and_later_ones_another() -> None:
    def run(name: str, start: float, end: float) -> DaemonRun:
        return DaemonRun(Path(name), [{"event": "a", "t_wall": start}, {"event": "b", "t_wall": end}], [])

    node0, node1, resumed = run("n0", 0.0, 10.0), run("n1", 0.5, 9.0), run("again", 20.0, 30.0)
    found = sessions([resumed, node1, node0])
    assert [[r.path.name for r in s.runs] for s in found] == [["n0", "n1"], ["again"]]


# -- invariants over generated runs ------------------------------------------------------

FAILURES = st.sampled_from(["crash", "hang", "abort", "none"])


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[Event], float]:
    t = 0.0
    events = [ev("run_started", t)]
    gens = draw(st.integers(1, 5))
    steps = draw(st.booleans())
    for g in range(gens):
        t += draw(st.floats(0.0, 3.0))
        start = t
        first = (t + draw(st.floats(0.0, 2.0)), t + draw(st.floats(0.0, 2.0)))
        events += generation(g, start, first if steps else None)
        t = max(first) if steps else t
        for _ in range(draw(st.integers(0, 3))):
            t += draw(st.floats(0.0, 2.0))
            events.append(saved(g, t, iteration=draw(st.integers(0, 100))))
        t += draw(st.floats(0.0, 5.0))
        kind = draw(FAILURES) if g < gens - 1 else draw(st.sampled_from(["none", "abort", "crash"]))
        if kind == "hang":
            silent = draw(st.floats(0.0, 20.0))
            events.append(ev("rank_hung", t, generation=g, rank=1, open_for=silent))
            events += crash(g, t + 0.1)[1:]
        elif kind in ("crash", "abort"):
            events += crash(g, t)
        else:
            events += success(g, t)
        t += 0.5
        if kind == "abort" or (kind == "none" and g < gens - 1):
            break
    finished = draw(st.booleans())
    if finished:
        events.append(ev("run_finished", t + 0.1))
    return events, t + draw(st.floats(0.0, 5.0))


@settings(max_examples=80, deadline=None)  # each CI run draws anew
@given(runs())
def test_goodput_is_a_fraction_and_lost_time_never_exceeds_the_wall_time(
    run: tuple[list[Event], float],
) -> None:
    events, now = run
    s = feed(events, now)
    balanced(s)
    for i in s.incidents:
        assert i.detection >= 0 and i.recomputation >= 0 and (i.restart is None or i.restart >= 0)
        assert i.lost <= s.wall + 1e-6
    # every prefix, as the live gauge sees it
    ledger = Ledger()
    for name, record in events:
        ledger.add(name, record)
        balanced(ledger.summary(float(record["t_wall"])))


NAMES = st.sampled_from(["run_started", "generation_started", "generation_ended", "rank_spawned",
                         "rank_stepping", "rank_exited", "rank_hung", "checkpoint_reported", "decision",
                         "job_decision", "peer_news", "run_finished", "other"])  # fmt: skip
KEYS = st.sampled_from(["t_wall", "generation", "rank", "state", "open_for", "checkpoint", "iteration",
                        "action", "result", "verdict"])  # fmt: skip
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.floats(-1e3, 1e3), st.text(max_size=3),
                   st.sampled_from(["failed", "saved", "restart"]))  # fmt: skip


@settings(max_examples=80, deadline=None)  # each CI run draws anew
@given(st.lists(st.tuples(NAMES, st.dictionaries(KEYS, VALUES))))
def test_whatever_it_is_fed_the_ledger_never_raises(events: list[tuple[str, dict[str, Any]]]) -> None:
    ledger = Ledger()
    for name, record in events:
        ledger.add(name, record)
    s = ledger.summary()
    balanced(s)
    assert s.productive + s.lost <= s.wall + 1e-6
