import itertools

import pytest

from supervisor.core.states import (
    ALLOWED,
    GroupResult,
    IllegalTransition,
    RankState,
    advance,
    group_result,
)

S = RankState


@pytest.mark.parametrize(("old", "new"), list(itertools.product(RankState, RankState)))
def test_every_pair_follows_the_table(old: RankState, new: RankState) -> None:
    if new in ALLOWED[old]:
        assert advance(old, new) is new
    else:
        with pytest.raises(IllegalTransition):
            advance(old, new)


def test_terminal_states_have_no_way_out() -> None:
    for state in (S.SUCCEEDED, S.FAILED, S.STOPPED):
        assert ALLOWED[state] == frozenset()


def test_every_state_is_in_the_table() -> None:
    assert set(ALLOWED) == set(RankState)


def test_one_failure_fails_the_group() -> None:
    assert group_result({0: S.RUNNING, 1: S.FAILED}) is GroupResult.FAILED
    assert group_result({0: S.SUCCEEDED, 1: S.FAILED}) is GroupResult.FAILED


def test_group_succeeds_only_when_every_rank_did() -> None:
    assert group_result({0: S.SUCCEEDED, 1: S.RUNNING}) is GroupResult.RUNNING
    assert group_result({0: S.SUCCEEDED, 1: S.SUCCEEDED}) is GroupResult.SUCCEEDED
    assert group_result({}) is GroupResult.RUNNING


def test_a_group_ended_without_failure_is_stopped() -> None:
    assert group_result({0: S.STOPPED, 1: S.SUCCEEDED}) is GroupResult.STOPPED
    assert group_result({0: S.STOPPED, 1: S.UNKILLABLE}) is GroupResult.STOPPED
    assert group_result({0: S.STOPPED, 1: S.STOPPING}) is GroupResult.RUNNING
