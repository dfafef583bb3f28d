import itertools

import pytest

from supervisor.core.states import (
    ALLOWED,
    GroupVerdict,
    IllegalTransition,
    RankState,
    advance,
    group_verdict,
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
    assert group_verdict({0: S.RUNNING, 1: S.FAILED}) is GroupVerdict.FAILED
    assert group_verdict({0: S.SUCCEEDED, 1: S.FAILED}) is GroupVerdict.FAILED


def test_group_succeeds_only_when_every_rank_did() -> None:
    assert group_verdict({0: S.SUCCEEDED, 1: S.RUNNING}) is GroupVerdict.RUNNING
    assert group_verdict({0: S.SUCCEEDED, 1: S.SUCCEEDED}) is GroupVerdict.SUCCEEDED
    assert group_verdict({}) is GroupVerdict.RUNNING


def test_a_group_ended_without_failure_is_stopped() -> None:
    assert group_verdict({0: S.STOPPED, 1: S.SUCCEEDED}) is GroupVerdict.STOPPED
    assert group_verdict({0: S.STOPPED, 1: S.UNKILLABLE}) is GroupVerdict.STOPPED
    assert group_verdict({0: S.STOPPED, 1: S.STOPPING}) is GroupVerdict.RUNNING
