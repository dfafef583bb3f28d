"""Recovery time from the event stream: a failure noticed -> the next generation stepping."""

from __future__ import annotations

from typing import Any

from supervisor.core.recovery import Recovery


def _feed(r: Recovery, *events: tuple[str, float, dict[str, Any]]) -> list[float]:
    out = []
    for name, t, fields in events:
        seconds = r.add(name, {"event": name, "t_mono": t, **fields})
        if seconds is not None:
            out.append(seconds)
    return out


def _generation(g: int, t: float, ranks: tuple[int, ...] = (0, 1)) -> list[tuple[str, float, dict[str, Any]]]:
    spawned = [("rank_spawned", t - 1, {"generation": g, "rank": r, "standby": g > 0}) for r in ranks]
    return [*spawned, ("generation_started", t, {"generation": g})]


def _crash(g: int, t: float, rank: int = 1) -> tuple[str, float, dict[str, Any]]:
    return ("rank_exited", t, {"generation": g, "rank": rank, "state": "failed", "standby": None})


def _step(g: int, t: float, rank: int) -> tuple[str, float, dict[str, Any]]:
    return ("rank_stepping", t, {"generation": g, "rank": rank, "iteration": 0})


def test_from_the_crash_to_the_last_rank_of_the_next_generation_stepping() -> None:
    r = Recovery()
    got = _feed(
        r,
        *_generation(0, 1.0),
        _step(0, 2.0, 0),
        _step(0, 2.1, 1),
        _crash(0, 10.0),
        ("rank_exited", 10.2, {"generation": 0, "rank": 0, "state": "stopped"}),  # ended by us
        ("decision", 10.3, {"generation": 0, "action": "restart", "reason": "rank_failed"}),
        *_generation(1, 10.4),
        _step(1, 10.6, 1),
    )
    assert got == []  # rank 0 has not stepped yet
    assert _feed(r, _step(1, 10.75, 0)) == [0.75]
    assert _feed(r, _step(1, 11.0, 0)) == []  # once per failure


def test_a_hang_counts_from_its_notice_and_later_signs_do_not_move_it() -> None:
    r = Recovery()
    got = _feed(
        r,
        *_generation(0, 1.0),
        ("rank_hung", 5.0, {"generation": 0, "rank": 1, "kind": "heartbeat", "late_by": 0.001}),
        _crash(0, 5.5),  # the hung rank killed: the failure was noticed before
        *_generation(1, 6.0),
        _step(1, 6.5, 0),
        _step(1, 7.0, 1),
    )
    assert got == [2.0]


def test_standbys_that_die_and_operator_restarts() -> None:
    r = Recovery()
    dead_standby = ("rank_exited", 3.0, {"generation": 1, "rank": 0, "state": "failed", "standby": True})
    got = _feed(
        r,
        *_generation(0, 1.0),
        dead_standby,  # a standby of the next generation is no failure of this one
        _step(0, 4.0, 0),
        _step(0, 4.0, 1),
    )
    assert got == [] and r.failed is None
    got = _feed(
        r,
        ("restart_requested", 8.0, {"generation": 0}),
        *_generation(1, 8.5),
        _step(1, 9.0, 0),
        _step(1, 9.5, 1),
    )
    assert got == [1.5]


def test_a_next_generation_that_fails_before_stepping_starts_a_new_measurement() -> None:
    r = Recovery()
    got = _feed(
        r,
        *_generation(0, 1.0),
        _crash(0, 2.0),
        *_generation(1, 3.0),
        _step(1, 3.5, 0),
        _crash(1, 4.0),  # rank 1 never stepped in generation 1
        *_generation(2, 5.0),
        _step(2, 5.5, 0),
        _step(2, 6.0, 1),
    )
    assert got == [2.0]  # generation 1's failure to generation 2 stepping


def test_ranks_that_never_report_steps_give_no_measurement() -> None:
    r = Recovery()
    assert _feed(r, *_generation(0, 1.0), _crash(0, 2.0), *_generation(1, 3.0)) == []
    assert _feed(r, ("generation_ended", 9.0, {"generation": 1, "result": "succeeded"})) == []


def test_a_node_that_moved_waits_for_its_new_ranks() -> None:
    r = Recovery()
    got = _feed(
        r,
        *_generation(0, 1.0),
        _crash(0, 2.0),
        ("rank_spawned", 2.5, {"generation": 1, "rank": 0}),
        ("rank_spawned", 2.5, {"generation": 1, "rank": 1}),
        ("node_moved", 3.0, {"generation": 1, "node_rank": 1, "nnodes": 2}),
        ("rank_spawned", 3.1, {"generation": 1, "rank": 2}),
        ("rank_spawned", 3.1, {"generation": 1, "rank": 3}),
        ("generation_started", 3.2, {"generation": 1}),
        _step(1, 4.0, 2),
        _step(1, 4.5, 3),
    )
    assert got == [2.5]


def test_requests_to_continue_and_events_without_a_generation_are_ignored() -> None:
    r = Recovery()
    got = _feed(
        r,
        *_generation(0, 1.0),
        ("workload_request", 2.0, {"generation": 0, "rank": 0, "action": "continue"}),
        ("status", 2.5, {"generation": None}),
        ("run_started", 0.5, {}),
    )
    assert got == [] and r.failed is None
    _feed(r, ("workload_request", 3.0, {"generation": 0, "rank": 0, "action": "restart"}))
    assert r.failed == (0, 3.0)
