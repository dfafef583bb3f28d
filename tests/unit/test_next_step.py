"""The daemon's choices after a generation, as pure functions: which way a node
decides, and what the job does once every node has spoken."""

from __future__ import annotations

import pytest

from supervisor.core.evidence import Part, WorkloadRequest, part_of
from supervisor.core.jobwide import NodeOutcome, PeerNews
from supervisor.core.next_step import (
    OPERATOR_RESTART,
    Basis,
    GenerationEnd,
    basis_of,
    job_outcome,
    without_evidence,
)
from supervisor.core.policy import Budget
from supervisor.core.types import Action, Reason

ASK = WorkloadRequest(0, "restart", "loss spiked")
NEWS = PeerNews.ENDED


@pytest.mark.parametrize(
    ("end", "expected"),
    [
        (GenerationEnd(succeeded=True, failed=False), Basis.SUCCEEDED),
        (GenerationEnd(succeeded=True, failed=False, requests=(ASK,)), Basis.JUDGE),
        (GenerationEnd(succeeded=False, failed=True), Basis.JUDGE),
        # an operator's restart wins over whatever the ranks did ...
        (GenerationEnd(succeeded=False, failed=True, restart_requested=True), Basis.OPERATOR_RESTART),
        (GenerationEnd(succeeded=True, failed=False, restart_requested=True), Basis.OPERATOR_RESTART),
        # ... unless a rank could not be killed: that is a node problem to judge
        (GenerationEnd(succeeded=False, failed=False, restart_requested=True, unkillable=(1,)), Basis.JUDGE),
        # healthy ranks ended by a peer's news follow the peer
        (GenerationEnd(succeeded=False, failed=False, peer_news=NEWS), Basis.FOLLOW_PEER),
        # but a rank that failed on its own, spoke up, asked or got stuck is judged here
        (GenerationEnd(succeeded=False, failed=True, peer_news=NEWS), Basis.JUDGE),
        (GenerationEnd(succeeded=False, failed=False, peer_news=NEWS, reported=True), Basis.JUDGE),
        (GenerationEnd(succeeded=False, failed=False, peer_news=NEWS, requests=(ASK,)), Basis.JUDGE),
        (GenerationEnd(succeeded=False, failed=False, peer_news=NEWS, unkillable=(0,)), Basis.JUDGE),
        # once the job's blame names another node's rank, what failed here (a waiting rank whose
        # peer went away as that node stopped its ranks) is its symptom: the node follows
        (GenerationEnd(succeeded=False, failed=True, peer_news=NEWS, blamed_elsewhere=True),
         Basis.FOLLOW_PEER),
        (GenerationEnd(succeeded=False, failed=True, peer_news=NEWS, reported=True, blamed_elsewhere=True),
         Basis.FOLLOW_PEER),
        (GenerationEnd(succeeded=False, failed=True, peer_news=NEWS, unkillable=(0,), blamed_elsewhere=True),
         Basis.JUDGE),
    ],
)
def test_the_basis_a_node_decides_on(end: GenerationEnd, expected: Basis) -> None:
    assert basis_of(end) is expected


def test_decisions_without_evidence() -> None:
    budget = Budget(max_restarts=1)
    assert without_evidence(Basis.OPERATOR_RESTART, None, budget, 0.0, "") == OPERATOR_RESTART
    followed = without_evidence(Basis.FOLLOW_PEER, PeerNews.ENDED, budget, 0.0, "node 1 failed")
    assert (followed.action, followed.detail) == (Action.RESTART, "node 1 failed")
    spent = budget.spend(0.0)
    lost = without_evidence(Basis.FOLLOW_PEER, PeerNews.LOST, spent, 1.0, "node 1 is gone")
    assert (lost.action, lost.reason) == (Action.RESCHEDULE, Reason.RESTARTS_EXHAUSTED)
    with pytest.raises(ValueError, match="needs this node's evidence"):
        without_evidence(Basis.JUDGE, None, budget, 0.0, "")


def _out(rank: int, action: Action, reason: Reason | None = None, *, peer: bool = False) -> NodeOutcome:
    return NodeOutcome(rank, action, reason, f"node {rank}: {action}", node=f"host{rank}", peer=peer)


def test_a_failure_restarts_the_job_spends_once_and_the_lowest_live_node_records_it() -> None:
    outcomes = [
        _out(0, Action.RESTART, Reason.PEER_FAILED),
        _out(1, Action.RESTART, Reason.RANK_FAILED),
    ]
    for own in outcomes:
        s = job_outcome(own, outcomes, multi=True)
        assert (s.action, s.spends, s.adopted) == (Action.RESTART, True, None)
        assert s.records is (own.node_rank == 0)
    alone = job_outcome(outcomes[1], outcomes, multi=False)
    assert alone.spends and not alone.records  # a single node keeps its budget itself


def test_a_lost_node_does_not_record_and_free_reasons_spend_nothing() -> None:
    outcomes = [
        _out(0, Action.RESCHEDULE, Reason.NODE_LOST),
        _out(1, Action.RESTART, Reason.RANK_FAILED),
        _out(2, Action.RESTART, Reason.PEER_FAILED),
    ]
    assert job_outcome(outcomes[1], outcomes, multi=True).records
    joining = [_out(0, Action.RESTART, Reason.MEMBERSHIP), _out(1, Action.RESTART, Reason.MEMBERSHIP)]
    assert not job_outcome(joining[0], joining, multi=True).spends
    # a peer-only failure (a reset connection) within a membership change is its consequence
    reset = [
        _out(0, Action.RESTART, Reason.MEMBERSHIP),
        _out(1, Action.RESTART, Reason.RANK_FAILED, peer=True),
    ]
    assert not job_outcome(reset[0], reset, multi=True).spends


def test_a_node_adopts_the_decision_of_the_node_that_decided_the_job() -> None:
    outcomes = [_out(0, Action.CONTINUE), _out(1, Action.ABORT, Reason.NOT_RETRYABLE)]
    s = job_outcome(outcomes[0], outcomes, multi=True)
    assert s.action is Action.ABORT and not s.spends
    assert s.adopted is not None
    assert (s.adopted.action, s.adopted.reason) == (Action.ABORT, Reason.PEER_FAILED)
    assert s.adopted.detail.startswith("node 1 (host1) decided abort")
    assert job_outcome(outcomes[1], outcomes, multi=True).adopted is None  # its own decision


@pytest.mark.parametrize(
    ("state", "code", "error_at", "hung", "reported", "expected"),
    [
        ("running", None, None, False, False, None),
        ("succeeded", 0, None, False, False, None),
        ("failed", 1, None, False, False, Part.FAILED),
        ("stopped", 0, None, False, False, Part.BYSTANDER),  # exited cleanly as we stopped it
        ("stopped", -15, None, False, False, Part.STOPPED),  # did not end cleanly: Evidence.stopped
        ("stopped", -15, 9.0, False, False, Part.FAILED),  # raised before we signalled it
        ("stopped", -15, 11.0, False, False, Part.STOPPED),  # ... after: the stop's consequence
        ("stopped", -9, None, True, False, Part.FAILED),  # hung
        # its client reported its exception before we stopped it (Lightning's BoringModel
        # under load: its peer read the reset of its teardown and exited first)
        ("stopped", -15, None, False, True, Part.FAILED),
    ],
)
def test_the_part_a_rank_played_in_its_generations_failure(
    state: str, code: int | None, error_at: float | None, hung: bool, reported: bool, *, expected: Part | None
) -> None:
    """One rule for the daemon and for `ft-supervisor classify` (it was written twice)."""
    part = part_of(state, exit_code=code, error_at=error_at, stop_wall=10.0, hung=hung,
                   reported_first=reported)  # fmt: skip
    assert part is expected
