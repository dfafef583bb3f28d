"""The core of the snapshots held in memory: the step a restore may use, and a rank's slots."""

from __future__ import annotations

import pytest

from supervisor.core.memory_snapshots import RankSlots, common_step, held_steps


@pytest.mark.parametrize(
    ("held", "expected"),
    [
        ({}, None),
        ({0: set()}, None),
        ({0: {4, 5}}, 5),
        ({0: {4, 5}, 1: {5, 6}}, 5),  # rank 1 is a step ahead: the step both hold
        ({0: {4, 5}, 1: {4, 5}}, 5),
        ({0: {4, 5}, 1: {6, 7}}, None),  # nothing in common: never mixed steps
        ({0: {4, 5}, 1: set()}, None),  # a rank that holds nothing holds back the node
        ({0: [9, 3], 1: (3, 9), 2: frozenset({3})}, 3),
    ],
)
def test_the_common_step_is_the_newest_every_rank_holds(
    held: dict[int, set[int]], expected: int | None
) -> None:
    assert common_step(held) == expected


def test_a_slot_is_complete_only_after_its_begin_and_done_in_one_generation() -> None:
    slots = RankSlots()
    assert slots.done(0, 0, 1, 10, "ab", size=100, now=1.0) is None  # never begun
    slots.begin(0, 0, now=1.0)
    assert slots.done(0, 0, 1, 10, "ab", size=100, now=1.5) == 0.5
    assert slots.steps() == {1} and slots.holding(1) is not None
    slots.begin(1, 0, now=2.0)
    assert slots.done(1, 0, 2, 101, "cd", size=100, now=2.1) is None  # longer than its file
    assert slots.steps() == {1}
    # a rank that died between begin and done: its next generation cannot complete that begin
    slots.begin(1, 0, now=3.0)
    assert slots.done(1, 1, 2, 10, "cd", size=100, now=3.1) is None
    assert slots.steps() == {1}
    held = slots.holding(1)
    assert held is not None and held[0] == 0
    assert (held[1].step, held[1].nbytes, held[1].checksum) == (1, 10, "ab")


def test_a_begin_takes_the_slot_out_of_what_is_held() -> None:
    slots = RankSlots()
    for slot, step in ((0, 1), (1, 2)):
        slots.begin(slot, 0, now=0.0)
        slots.done(slot, 0, step, 10, "ab", size=10, now=0.0)
    newest = slots.newest()
    assert slots.steps() == {1, 2} and newest is not None and newest.step == 2
    slots.begin(0, 0, now=1.0)  # about to overwrite step 1
    assert slots.steps() == {2}
    assert slots.done(0, 0, 3, 10, "ef", size=10, now=1.0) is not None
    assert slots.steps() == {2, 3}
    assert slots.done(0, 0, 4, 10, "ef", size=10, now=1.0) is None  # one done per begin


def test_held_steps_counts_a_rank_without_slots_as_holding_nothing() -> None:
    slots = RankSlots()
    slots.begin(0, 0, now=0.0)
    slots.done(0, 0, 5, 1, "a", size=1, now=0.0)
    assert held_steps({0: slots}, [0, 1]) == {0: {5}, 1: set()}
    assert common_step(held_steps({0: slots}, [0])) == 5


def test_only_slots_a_gone_generations_rank_began_are_unfinished_and_a_seal_must_fit() -> None:
    slots = RankSlots()
    slots.begin(0, 3, now=1.0)
    slots.begin(1, 4, now=2.0)
    assert slots.unfinished(before=4) == [0] and slots.unfinished(before=5) == [0, 1]
    slots.writing[0] = (-1, 3.0)  # the daemon fills it from a peer: never sealed from its header
    assert slots.unfinished(before=5) == [1]
    assert not slots.seal(1, 7, 10**9, "ab", size=4096, now=5.0)  # longer than the slot
    assert slots.seal(1, 7, 4096, "ab", size=4096, now=5.0)
    assert slots.steps() == {7} and slots.unfinished(before=5) == []
