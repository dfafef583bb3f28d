import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.policy import Budget, GenerationEnd, decide
from supervisor.core.types import Action, ExitStatus, RankExit, RankFailure, Reason

FAIL = RankFailure(RankExit(1, 1, 42, ExitStatus(code=1), at=1.0, at_wall=1.0))


def test_restarts_while_the_budget_lasts() -> None:
    d = decide(GenerationEnd((FAIL,)), Budget(3, used=2), now=0.0)
    assert d.action is Action.RESTART
    assert d.reason is Reason.RANK_FAILED
    assert "restart 3 of 3" in d.detail


def test_exhausted_budget_gives_up() -> None:
    d = decide(GenerationEnd((FAIL,)), Budget(3, used=3), now=0.0)
    assert d.action is Action.ABORT
    assert d.reason is Reason.RESTARTS_EXHAUSTED
    assert "rank 1 failed (exit code 1)" in d.detail


def test_a_rank_stuck_in_the_kernel_is_never_restarted_over() -> None:
    d = decide(GenerationEnd((FAIL,), unkillable=(0,)), Budget(5), now=0.0)
    assert d.action is Action.ABORT
    assert d.reason is Reason.RANK_UNKILLABLE


def test_a_failed_generation_needs_evidence() -> None:
    with pytest.raises(ValueError, match="at least one failure"):
        decide(GenerationEnd(()), Budget(1), now=0.0)


def test_budget_rejects_negative_values() -> None:
    with pytest.raises(ValueError):
        Budget(-1)


@given(st.integers(0, 50), st.integers(0, 60), st.booleans())
def test_never_restarts_without_budget(max_restarts: int, used: int, stuck: bool) -> None:
    budget = Budget(max_restarts, used)
    d = decide(GenerationEnd((FAIL,), unkillable=(0,) if stuck else ()), budget, now=0.0)
    if d.action is Action.RESTART:
        assert budget.remaining > 0 and not stuck
    assert budget.spend().remaining == max(0, budget.remaining - 1)
