"""The policy, pure: budgets, escalation, crash loops, requests, and its invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.classify import Classification
from supervisor.core.evidence import Evidence, WorkloadRequest
from supervisor.core.exitcodes import ExitCodes, OutcomeError, apply_presets
from supervisor.core.policy import Budget, History, Past, Policy, decide
from supervisor.core.types import SEVERITY, Action, ExitStatus, RankExit, RankFailure, Reason

FAIL = RankFailure(RankExit(1, 1, 42, ExitStatus(code=1), at=1.0, at_wall=1.0))
EV = Evidence((FAIL,))
TRANSIENT = Classification("N7", "network", "transient", Action.RESTART, Action.RESCHEDULE, rank=1)
BUG = Classification("P9", "python", "deterministic", Action.RESTART, rank=1)
ECC = Classification("C3", "cuda", "hardware", Action.RESCHEDULE, rank=1)
ASSERT = Classification("C6", "cuda", "deterministic", Action.ABORT, rank=1)
OOM = Classification("X-SIGKILL", "oom", "deterministic", Action.RESTART, Action.ABORT, rank=1)
XID94 = Classification("H1", "xid", "hardware", Action.RESTART, rank=1)


def _history(*rules: Classification, progress: int | None = None) -> History:
    h = History()
    for i, c in enumerate(rules):
        h = h.add(Past(float(i), c.rule, c.nature, c.signature, progress))
    return h


def test_a_failure_restarts_while_the_budget_lasts() -> None:
    d = decide(EV, BUG, History(), Budget(3, restarts_at=(0.0, 1.0)), now=2.0)
    assert (d.action, d.reason) == (Action.RESTART, Reason.RANK_FAILED)
    assert "restart 3 (0 left after it)" in d.detail


def test_exhausted_budget_reschedules_transient_and_aborts_deterministic() -> None:
    spent = Budget(1, restarts_at=(0.0,))
    assert decide(EV, BUG, History(), spent, now=1.0).action is Action.ABORT
    d = decide(EV, Classification("N6", "peer", "transient", Action.RESTART), History(), spent, now=1.0)
    assert (d.action, d.reason) == (Action.RESCHEDULE, Reason.RESTARTS_EXHAUSTED)


def test_a_restart_window_forgets_old_restarts() -> None:
    budget = Budget(2, window=60.0, restarts_at=(0.0, 10.0))
    assert decide(EV, BUG, History(), budget, now=30.0).action is Action.ABORT  # both within 60 s
    assert decide(EV, BUG, History(), budget, now=65.0).action is Action.RESTART  # the first aged out
    assert budget.remaining(71.0) == 2


def test_escalation_the_same_hardware_looking_failure_twice_reschedules() -> None:
    assert decide(EV, XID94, History(), Budget(5), now=0.0).action is Action.RESTART
    d = decide(EV, XID94, _history(XID94), Budget(5), now=1.0)
    assert (d.action, d.reason) == (Action.RESCHEDULE, Reason.REPEATED)


def test_a_rule_repeat_applies_after_its_count() -> None:
    assert decide(EV, TRANSIENT, History(), Budget(5), now=0.0).action is Action.RESTART
    assert decide(EV, TRANSIENT, _history(TRANSIENT), Budget(5), now=0.0).action is Action.RESCHEDULE
    # "restart once, then abort": the OOM killer never loops...
    stuck = Evidence((FAIL,), progress=0)
    d = decide(stuck, OOM, _history(OOM, progress=0), Budget(5), now=0.0)
    assert (d.action, d.reason) == (Action.ABORT, Reason.REPEATED)
    assert "without progress" in d.detail


def test_a_failure_after_progress_is_a_new_incident_not_a_repeat() -> None:
    # issue 11: two SIGKILLs an epoch apart aborted with restarts left
    moved_on = Evidence((FAIL,), progress=400)
    assert decide(moved_on, OOM, _history(OOM, progress=0), Budget(3), now=0.0).action is Action.RESTART
    assert decide(moved_on, XID94, _history(XID94), Budget(3), now=0.0).action is Action.RESTART
    # ...and the failure that ended a generation with progress starts the count again
    h = _history(OOM, progress=0).add(Past(1.0, "P9", "deterministic", "P9|", progress=300))
    assert decide(Evidence((FAIL,), progress=0), OOM, h, Budget(3), now=2.0).action is Action.RESTART
    h = _history(OOM, progress=300)
    assert decide(Evidence((FAIL,), progress=0), OOM, h, Budget(3), now=2.0).action is Action.ABORT


def test_without_progress_reports_a_repeat_never_aborts() -> None:
    # the ranks never said how far they got: a repeat cannot be told from a new incident
    d = decide(EV, OOM, _history(OOM), Budget(5), now=0.0)
    assert (d.action, d.reason) == (Action.RESTART, Reason.RANK_FAILED)
    # a repeat may still send the node away: that is not the end of the job
    assert decide(EV, TRANSIENT, _history(TRANSIENT), Budget(5), now=0.0).action is Action.RESCHEDULE
    assert decide(EV, XID94, _history(XID94), Budget(5), now=0.0).action is Action.RESCHEDULE
    # and the budget still bounds it: spent, a deterministic failure aborts
    assert decide(EV, OOM, _history(OOM), Budget(1, restarts_at=(0.0,)), now=1.0).action is Action.ABORT


def test_a_crash_loop_without_progress_aborts() -> None:
    ev = Evidence((FAIL,), progress=0)
    # two failures before without progress, and this one: 3 in a row (nvidia-resiliency-ext's default)
    d = decide(ev, BUG, _history(BUG, BUG, progress=0), Budget(10), now=0.0)
    assert (d.action, d.reason) == (Action.ABORT, Reason.NO_PROGRESS)
    # progress anywhere in the streak, or a checkpoint saved now, breaks it
    assert decide(ev, BUG, _history(BUG, BUG, progress=5), Budget(10), now=0.0).action is Action.RESTART
    saved = Evidence((FAIL,), progress=0, saved=True)
    assert decide(saved, BUG, _history(BUG, BUG, progress=0), Budget(10), now=0.0).action is Action.RESTART
    # no iterations ever reported: progress is unknown, never a crash loop
    unknown = Evidence((FAIL,))
    assert decide(unknown, BUG, _history(BUG, BUG), Budget(10), now=0.0).action is Action.RESTART
    # disabled
    off = Policy(max_no_progress=0)
    assert (
        decide(ev, BUG, _history(BUG, BUG, progress=0), Budget(10), now=0.0, policy=off).action
        is Action.RESTART
    )


def test_requests_are_honoured_and_an_abort_classification_stays_abort() -> None:
    asks = (WorkloadRequest(0, "shutdown"), WorkloadRequest(1, "exclude_node", "bad NIC"))
    d = decide(Evidence((FAIL,), requests=asks), BUG, History(), Budget(3), now=0.0)
    assert (d.action, d.reason, d.detail) == (
        Action.RESCHEDULE,
        Reason.WORKLOAD_REQUEST,
        "rank 1 asked to exclude_node: bad NIC",
    )
    d = decide(Evidence((FAIL,), requests=asks), ASSERT, History(), Budget(3), now=0.0)
    assert d.action is Action.ABORT


def test_a_rank_stuck_in_the_kernel_reschedules() -> None:
    d = decide(Evidence((FAIL,), unkillable=(0,)), BUG, History(), Budget(5), now=0.0)
    assert (d.action, d.reason) == (Action.RESCHEDULE, Reason.RANK_UNKILLABLE)


def test_budget_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="max_restarts"):
        Budget(-1)
    with pytest.raises(ValueError, match="window"):
        Budget(1, window=0)


def test_exit_codes_and_presets() -> None:
    codes = ExitCodes(reschedule=3)
    assert [codes.of(a) for a in (Action.CONTINUE, Action.RESCHEDULE, Action.ABORT)] == [0, 3, 2]
    with pytest.raises(OutcomeError, match="signal 2"):
        ExitCodes(reschedule=130)
    with pytest.raises(OutcomeError, match="must differ"):
        ExitCodes(reschedule=2)
    assert apply_presets(["recover"]).on_failure is Action.RESCHEDULE
    both = apply_presets(["retry", "recover"])
    assert (both.on_failure, both.on_exhausted) == (Action.RESTART, Action.RESCHEDULE)
    assert apply_presets(["exit"]).on_failure is Action.ABORT
    assert apply_presets(["recover-in-place", "dump"]) == Policy()
    with pytest.raises(OutcomeError, match="elastic-training"):
        apply_presets(["elastic-training"])
    spent = Budget(0)
    assert decide(EV, TRANSIENT, History(), spent, now=0.0, policy=both).action is Action.RESCHEDULE
    recover = apply_presets(["recover"])
    assert decide(EV, TRANSIENT, History(), Budget(5), now=0.0, policy=recover).action is Action.RESCHEDULE


# -- invariants ------------------------------------------------------------------------

actions = st.sampled_from(list(Action))
natures = st.sampled_from(["transient", "hardware", "deterministic"])
classifications = st.builds(
    Classification,
    rule=st.sampled_from(["A", "B", "C"]),
    category=st.sampled_from(["x", "hang"]),
    nature=natures,
    action=actions,
    repeat=st.none() | actions,
    after=st.integers(1, 3),
    rank=st.just(1),
)
pasts = st.builds(
    Past,
    at=st.floats(0, 100),
    rule=st.sampled_from(["A", "B", "C"]),
    nature=natures,
    signature=st.sampled_from(["s1", "s2"]),
    progress=st.none() | st.integers(0, 3),
    saved=st.booleans(),
)
histories = st.lists(pasts, max_size=6).map(lambda ps: History(tuple(ps)))
budgets = st.builds(
    Budget,
    max_restarts=st.integers(0, 5),
    window=st.none() | st.floats(1, 100),
    restarts_at=st.lists(st.floats(0, 100), max_size=6).map(tuple),
)
evidences = st.builds(
    Evidence,
    failures=st.just((FAIL,)),
    requests=st.lists(
        st.builds(
            WorkloadRequest, rank=st.just(0), action=st.sampled_from(["abort", "reschedule", "shutdown"])
        ),
        max_size=2,
    ).map(tuple),
    progress=st.none() | st.integers(0, 3),
)


@given(evidences, classifications, histories, budgets, st.floats(0, 200))
def test_abort_never_downgrades(ev: Evidence, c: Classification, h: History, b: Budget, now: float) -> None:
    if c.action is Action.ABORT:
        assert decide(ev, c, h, b, now).action is Action.ABORT


@given(evidences, classifications, histories, budgets, st.floats(0, 200))
def test_no_restart_without_budget(
    ev: Evidence, c: Classification, h: History, b: Budget, now: float
) -> None:
    d = decide(ev, c, h, b, now)
    if d.action is Action.RESTART:
        assert b.remaining(now) > 0


@given(classifications, histories, pasts, budgets, st.floats(0, 200))
def test_more_history_never_softens_a_decision(
    c: Classification, h: History, extra: Past, b: Budget, now: float
) -> None:
    ev = Evidence((FAIL,))
    before = decide(ev, c, h, b, now)
    after = decide(ev, c, History((extra, *h.failures)), b, now)
    # a failure further back can only escalate, except that an escalation that
    # reschedules is never turned into a restart
    if before.action in (Action.RESCHEDULE, Action.ABORT):
        assert SEVERITY[after.action] >= SEVERITY[Action.RESCHEDULE]


@given(evidences, classifications, histories, budgets, st.floats(0, 200))
def test_deterministic_and_total(ev: Evidence, c: Classification, h: History, b: Budget, now: float) -> None:
    assert decide(ev, c, h, b, now) == decide(ev, c, h, b, now)
