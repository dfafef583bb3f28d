"""The job-wide agreement on a restored step (``supervisor.core.job_snapshots``): every
node's record in, the newest step every rank can have, from its own node's slots, its
retained copies (the grid steps its peer verified) or a peer's replica; never mixed steps.
The daemons' side is tests/component/test_snapshot_replication.py (the wire, the grid, the
budget), tests/component/test_job_agreement.py (a lagging replica restored) and
tests/integration/test_job_snapshots.py (a node killed and replaced)."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.core.job_snapshots import (
    MAX_STRIDE,
    STEPS_PER_RANK,
    NodeHeld,
    Offer,
    agreed_stride,
    confirm,
    decide,
    left_behind,
    needed_stride,
    on_grid,
    pause,
    peer_of,
    read_offer,
    stale_replicas,
    stride_for,
)

Steps = dict[int, tuple[int, ...]]


def node(n: int, ranks: tuple[int, ...], held: Steps | None = None, replicas: Steps | None = None, *,
         retained: Steps | None = None, stride: int = 1) -> NodeHeld:  # fmt: skip
    endpoint = f"127.0.0.1:{9000 + n}"
    return NodeHeld(n, ranks, held or {}, replicas or {}, endpoint, "tok", retained or {}, stride)


def test_every_rank_in_its_own_memory_restores_the_newest_common_step() -> None:
    d = decide({0: node(0, (0, 1), {0: (4, 5), 1: (5, 6)}), 1: node(1, (2, 3), {2: (4, 5), 3: (5, 6)})}, 2)
    assert d.step == 5
    assert d.sources == {r: (r // 2, False) for r in range(4)}
    assert d.fetched(0, (0, 1)) == {}


def test_a_lost_nodes_ranks_come_from_the_peer_replica_and_an_older_replica_holds_the_job_back() -> None:
    # node 1 was replaced: nothing in memory; node 0 keeps its rank's replicas one step behind
    survivor = node(0, (0,), {0: (6, 7)}, replicas={1: (5, 6)})
    d = decide({0: survivor, 1: node(1, (1,))}, 2)
    assert d.step == 6  # both slots' steps count: the older one every rank has
    assert d.sources == {0: (0, False), 1: (0, True)}
    assert d.fetched(1, (1,)) == {1: 0}
    assert "rank(s) [1]" in d.why


def test_a_replica_several_steps_behind_meets_the_others_retained_copies() -> None:
    # stride 4: every node replicates steps 4, 8, ... and retains its own copies of them;
    # node 1 was lost at step 11, its rank's replica on node 0 is three steps behind
    survivor = node(0, (0,), {0: (10, 11)}, replicas={1: (4, 8)}, retained={0: (4, 8)}, stride=4)
    d = decide({0: survivor, 1: node(1, (1,))}, 2)
    assert d.step == 8
    assert d.sources == {0: (0, False), 1: (0, True)}
    assert d.kept((0,)) == [0] and d.fetched(1, (1,)) == {1: 0}
    assert "retained copy: rank(s) [0]" in d.why
    # without the retained copy the slots have moved on: no step every rank holds
    assert decide({0: node(0, (0,), {0: (10, 11)}, replicas={1: (4, 8)}), 1: node(1, (1,))}, 2).step is None


def test_a_node_one_grid_step_behind_makes_the_job_agree_on_the_older_one() -> None:
    # three nodes in a ring (0 -> 1 -> 2 -> 0); node 1 lost, its replica kept by node 2.
    # Node 0's copy of step 8 was not verified yet: it retains 4 and 0, so the job takes 4
    published = {
        0: node(0, (0,), {0: (9, 10)}, replicas={2: (4, 8)}, retained={0: (0, 4)}, stride=4),
        1: node(1, (1,)),
        2: node(2, (2,), {2: (9, 10)}, replicas={1: (4, 8)}, retained={2: (4, 8)}, stride=4),
    }
    d = decide(published, 3)
    assert d.step == 4
    assert d.sources == {0: (0, False), 1: (2, True), 2: (2, False)}
    assert d.retained == (0, 2)


def test_a_slot_wins_over_a_retained_copy_and_a_retained_copy_over_a_replica() -> None:
    d = decide({0: node(0, (0,), {0: (7, 8)}, replicas={1: (8,)}, retained={0: (8,)}),
                1: node(1, (1,), {1: (7,)}, replicas={0: (8,)}, retained={1: (8,)})}, 2)  # fmt: skip
    assert d.step == 8
    assert d.sources == {0: (0, False), 1: (1, False)} and d.retained == (1,)


def test_a_retained_copy_on_a_node_the_rank_left_is_fetched() -> None:
    # the order changed: rank 0 runs on node 0 now, its retained copy is on node 1
    d = decide({0: node(0, (0,), {0: (11,)}), 1: node(1, (1,), {1: (8, 11)}, retained={0: (8,)})}, 2)
    assert d.step == 11  # its own slot: newer than the retained copy elsewhere
    d = decide({0: node(0, (0,)), 1: node(1, (1,), {1: (8, 11)}, retained={0: (8,)})}, 2)
    assert d.step == 8 and d.sources[0] == (1, True) and d.retained == ()


def test_the_grid_widens_to_cover_the_copies_lag_and_the_agreement_takes_what_they_needed() -> None:
    assert [stride_for(lag, 1) for lag in (0, 1, 2, 3, 4, 7, 8)] == [1, 2, 4, 4, 8, 8, 16]
    assert stride_for(3, 4) == 4 and stride_for(0, 8) == 8  # keeping up: unchanged, never narrower
    assert needed_stride([]) == needed_stride([0, 0]) == 1 and needed_stride([0, 3, 1]) == 4
    assert stride_for(10**9, 1) == MAX_STRIDE
    assert [s for s in range(13) if on_grid(s, 4)] == [0, 4, 8, 12]
    assert all(on_grid(s, 1) for s in range(5))
    assert agreed_stride({0: node(0, (0,), stride=2), 1: node(1, (1,), stride=8)}) == 8
    assert agreed_stride({}) == 1


def test_steps_newer_than_the_agreed_one_are_a_timeline_the_job_left() -> None:
    held = {0: (4, 8), 1: (8, 12), 2: ()}
    assert left_behind(held, 8) == {1: [12]}
    assert left_behind(held, 12) == {}
    assert left_behind(held, None) == {0: [4, 8], 1: [8, 12]}  # from disk or afresh: all of them


def test_replicas_of_ranks_the_previous_node_no_longer_runs_are_stale() -> None:
    published = {0: node(0, (0, 1)), 1: node(1, (2, 3)), 2: node(2, (4, 5))}
    assert stale_replicas(1, 3, published, {0, 1, 4}) == [4]  # node 0 sends here: ranks 0 and 1
    assert stale_replicas(0, 3, published, {4, 5, 7}) == [7]  # node 2 sends here
    assert stale_replicas(0, 3, {0: published[0]}, {4, 7}) == []  # node 2 unknown: keep them
    assert stale_replicas(0, 1, {0: published[0]}, {4}) == [4]  # a node alone: nobody sends here


def test_memory_wins_over_a_replica_of_the_same_step() -> None:
    d = decide({0: node(0, (0,), {0: (3,)}, replicas={1: (3,)}), 1: node(1, (1,), {1: (3,)})}, 2)
    assert d.sources == {0: (0, False), 1: (1, False)}


def test_when_the_order_changed_a_rank_is_fetched_from_where_it_ran() -> None:
    # the survivor became node 1 (torch orders the nodes anew): it still holds rank 0's
    # slots in memory, and rank 1's replica, which is now its own rank's
    survivor = node(1, (1,), {0: (5, 6)}, replicas={1: (5, 6)})
    d = decide({0: node(0, (0,)), 1: survivor}, 2)
    assert d.step == 6
    assert d.sources == {0: (1, True), 1: (1, True)}


@pytest.mark.parametrize(
    ("published", "why"),
    [
        ({0: node(0, (0,), {0: (5,)})}, "node(s) [1] published nothing"),
        ({0: node(0, (0,), {0: (6, 7)}, replicas={1: (4, 5)}), 1: node(1, (1,))}, "no step every rank holds"),
        ({0: node(0, (0,), {0: (6,)}), 1: node(1, (1,))}, "no step every rank holds"),  # no replica
    ],
)
def test_no_memory_restore_without_every_node_or_a_common_step(
    published: dict[int, NodeHeld], why: str
) -> None:
    d = decide(published, 2)
    assert d.step is None and d.sources == {} and why in d.why


def test_a_node_speaks_only_for_ranks_of_the_job() -> None:
    d = decide({0: node(0, (0,), {0: (2,), 9: (2,)}, replicas={7: (1,)})}, 1)
    assert d.step == 2 and set(d.sources) == {0}


def test_the_nodes_confirm_one_step_or_none() -> None:
    assert confirm({0: {"step": 5, "why": ""}, 1: {"step": 5, "why": ""}}, 2)[0] == 5
    step, why = confirm({0: {"step": 5, "why": ""}, 1: {"step": None, "why": "fetch failed"}}, 2)
    assert step is None and "fetch failed" in why
    assert confirm({0: {"step": 5, "why": ""}, 1: {"step": 4, "why": ""}}, 2)[0] is None
    late = "node(s) [1] did not say in time that they are ready"
    assert confirm({0: {"step": 5, "why": ""}}, 2) == (None, late)
    assert confirm({0: None, 1: {"step": 5}}, 2)[0] is None


def test_a_record_round_trips_and_a_bad_one_is_refused() -> None:
    record = node(1, (2, 3), {2: (4, 5)}, replicas={0: (7,)}, retained={2: (0, 4)}, stride=4)
    assert NodeHeld.from_json(record.to_json(), 1) == record
    raw = record.to_json()
    older = {k: v for k, v in raw.items() if k not in ("retained", "stride")}  # a daemon of before
    assert NodeHeld.from_json(older, 1) == node(1, (2, 3), {2: (4, 5)}, replicas={0: (7,)})
    assert NodeHeld.from_json({**raw, "stride": 0}, 1).stride == 1
    for bad in (
        {**raw, "node": 0},
        {**raw, "held": {"2": [1, 2, 3]}},  # more than two steps a rank
        {**raw, "held": {"x": [1]}},
        {**raw, "replicas": {"2": [-1]}},
        {**raw, "retained": {"2": [1, 2, 3]}},
        {**raw, "ranks": "0"},
        {**raw, "token": 5},
        {**raw, "endpoint": "x" * 1000},
    ):
        with pytest.raises(ValueError):
            NodeHeld.from_json(bad, 1)
    assert len(record.to_json()["held"]["2"]) <= STEPS_PER_RANK


def offer(**fields: Any) -> dict[str, Any]:
    return {"kind": "replica", "token": "tok", "node": 0, "rank": 1, "step": 3, "bytes": 100,
            "checksum": "ab12", **fields}  # fmt: skip


def test_a_header_is_checked_before_anything_is_written() -> None:
    assert read_offer(offer(), "tok", limit=100) == Offer("replica", "tok", 0, 1, 3, 100, "ab12")
    assert read_offer(offer(kind="fetch"), "tok", limit=0) == Offer("fetch", "tok", 0, 1, 3)
    assert read_offer(offer(stride=8), "tok", limit=100) == Offer("replica", "tok", 0, 1, 3, 100, "ab12", 8)
    assert read_offer(offer(stride=True), "tok", limit=100) == Offer("replica", "tok", 0, 1, 3, 100, "ab12")
    assert "token" in str(read_offer(offer(token="other"), "tok", limit=100))
    assert "room" in str(read_offer(offer(bytes=101), "tok", limit=100))
    assert "room" in str(read_offer(offer(bytes=0), "tok", limit=100))
    assert "whole numbers" in str(read_offer(offer(step="3"), "tok", limit=100))
    assert "whole numbers" in str(read_offer(offer(rank=True), "tok", limit=100))
    assert "checksum" in str(read_offer(offer(checksum=""), "tok", limit=100))
    assert "kind" in str(read_offer(offer(kind="delete"), "tok", limit=100))
    assert "mapping" in str(read_offer([1], "tok", limit=100))


def test_the_next_node_keeps_the_replicas_and_the_copy_is_paced() -> None:
    assert [peer_of(n, 3) for n in range(3)] == [1, 2, 0]
    assert peer_of(0, 1) is None
    assert pause(1000, 1000, 0.5) == 0.5  # 1000 bytes at 1000 B/s: one second in all
    assert pause(1000, 1000, 2.0) == 0.0
    assert pause(10**9, 0, 0.0) == 0.0  # no bound
