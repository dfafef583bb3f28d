"""Job-wide agreement: the pure rules every node applies to the same outcomes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.jobwide import (
    NodeOutcome,
    PeerNews,
    ask_others_every,
    follow,
    joint,
    look_every,
    lost,
    pack,
    spends_budget,
    unpack,
)
from supervisor.core.policy import Budget
from supervisor.core.types import Action, Reason

A, R = Action, Reason


def out(rank: int, action: Action, reason: Reason | None = None) -> NodeOutcome:
    return NodeOutcome(rank, action, reason)


@pytest.mark.parametrize(
    ("mine", "theirs", "expected"),
    [
        (A.CONTINUE, A.CONTINUE, A.CONTINUE),  # every node done: the job is
        (A.CONTINUE, A.RESTART, A.RESTART),  # a finished node reruns with the job
        (A.RESTART, A.ABORT, A.ABORT),  # an abort anywhere stops all
        (A.RESTART, A.RESCHEDULE, A.RESTART),  # the other node leaves; this one rejoins
        (A.RESCHEDULE, A.RESTART, A.RESCHEDULE),  # this node leaves
        (A.RESCHEDULE, A.ABORT, A.ABORT),
        (A.CONTINUE, A.RESCHEDULE, A.RESTART),  # the job lost a node: it must rejoin
    ],
)
def test_joint_action(mine: Action, theirs: Action, expected: Action) -> None:
    me = out(0, mine, None if mine is A.CONTINUE else R.RANK_FAILED)
    other = out(1, theirs, None if theirs is A.CONTINUE else R.CLASSIFIED)
    assert joint(me, [me, other]) is expected


def test_no_restart_left_sends_the_whole_job_away() -> None:
    me = out(0, A.RESTART, R.PEER_FAILED)
    exhausted = out(1, A.RESCHEDULE, R.RESTARTS_EXHAUSTED)
    assert joint(me, [me, exhausted]) is A.RESCHEDULE


actions = st.sampled_from(list(Action))
reasons = st.sampled_from([None, *Reason])
outcomes = st.lists(st.builds(out, st.integers(0, 7), actions, reasons), min_size=1, max_size=6)


@given(outcomes)
def test_every_node_that_stays_agrees_with_the_others(round_: list[NodeOutcome]) -> None:
    results = {o.node_rank: joint(o, round_) for o in round_}
    if any(o.action is A.ABORT for o in round_):
        assert set(results.values()) == {A.ABORT}
    staying = {a for a in results.values() if a is not A.RESCHEDULE}
    assert len(staying) <= 1  # whoever does not leave does the same thing


@given(outcomes)
def test_a_node_leaves_only_if_it_asked_or_the_job_ran_out_of_restarts(round_: list[NodeOutcome]) -> None:
    for o in round_:
        if joint(o, round_) is A.RESCHEDULE:
            assert o.action is A.RESCHEDULE or any(x.reason is R.RESTARTS_EXHAUSTED for x in round_)


def test_only_failures_spend_the_jobs_restarts() -> None:
    assert spends_budget([out(0, A.RESTART, R.RANK_FAILED), out(1, A.RESTART, R.PEER_FAILED)])
    assert spends_budget([out(0, A.RESTART, R.NODE_LOST)])
    assert not spends_budget([out(0, A.RESTART, R.MEMBERSHIP), out(1, A.RESTART, R.MEMBERSHIP)])
    assert not spends_budget([out(0, A.RESTART, R.PEER_FAILED), out(1, A.RESCHEDULE, R.STOPPED)])
    assert not spends_budget([out(0, A.CONTINUE), out(1, A.CONTINUE)])


def test_a_rank_that_lost_its_peer_to_a_membership_change_costs_no_restart() -> None:
    # node 2 joins: node 0 stops its rank, node 1's rank reads the reset connection and
    # fails before node 1's daemon has heard of the newcomer
    reset = NodeOutcome(1, A.RESTART, R.RANK_FAILED, rule="D5", peer=True)
    assert not spends_budget([out(0, A.RESTART, R.MEMBERSHIP), reset])
    # without a membership change, a reset connection is a failure somewhere
    assert spends_budget([out(0, A.RESTART, R.PEER_FAILED), reset])
    # and a failure of its own within a membership change still counts
    assert spends_budget([out(0, A.RESTART, R.MEMBERSHIP), out(1, A.RESTART, R.RANK_FAILED)])


def test_following_a_peer() -> None:
    budget, spent = Budget(1), Budget(1).spend(0.0)
    assert follow(PeerNews.ENDED, spent, 1.0, "x").action is A.RESTART  # the failed node judged the budget
    assert follow(PeerNews.WAITING, spent, 1.0, "x").reason is R.MEMBERSHIP
    assert follow(PeerNews.LOST, budget, 1.0, "x").action is A.RESTART
    gone = follow(PeerNews.LOST, spent, 1.0, "node 1 lost")
    assert (gone.action, gone.reason) == (A.RESCHEDULE, R.RESTARTS_EXHAUSTED)


def test_lost_members() -> None:
    members = {0: "a", 1: "b", 2: "c"}
    participants = {"a", "b"}
    beats = {"a": 100.0, "b": 90.0}
    assert lost(members, participants, beats, now=101.0, bound=15.0) == {2}  # dropped by the rendezvous
    assert lost(members, participants, beats, now=106.0, bound=15.0) == {1, 2}  # b's keep-alive is stale


def test_outcomes_survive_the_store_and_bad_ones_are_named() -> None:
    o = NodeOutcome(3, A.ABORT, R.NOT_RETRYABLE, "rank 7: ImportError", node="gpu-12", rule="P0", peer=True)
    assert NodeOutcome.from_json(o.to_json()) == o
    with pytest.raises(ValueError, match="node_rank"):
        NodeOutcome.from_json({"node_rank": "3", "action": "abort"})
    with pytest.raises(ValueError, match="'action'"):
        NodeOutcome.from_json({"node_rank": 3})
    with pytest.raises(ValueError, match="explode"):
        NodeOutcome.from_json({"node_rank": 3, "action": "explode"})


full = st.builds(
    NodeOutcome,
    st.integers(0, 4096),
    actions,
    reasons,
    st.sampled_from(["", "rank 0 raised", "node 3 (h3): generation 0 failed"]),
    st.sampled_from(["", "h1", "gpu-12"]),
    st.sampled_from([None, "P0", "N1"]),
    st.booleans(),
)


@given(st.lists(full, max_size=40, unique_by=lambda o: o.node_rank))
def test_a_rounds_outcomes_are_published_once_and_read_back_alike(round_: list[NodeOutcome]) -> None:
    assert unpack(pack(round_)) == sorted(round_, key=lambda o: o.node_rank)


def test_followers_share_one_entry_and_bad_packs_are_named() -> None:
    failed = NodeOutcome(0, A.RESTART, R.RANK_FAILED, "rank 0 raised", node="h0")
    why = "node 0 (h0): generation 0 failed"
    followers = [NodeOutcome(r, A.RESTART, R.PEER_FAILED, why, node=f"h{r}") for r in range(1, 1000)]
    packed = pack([failed, *followers])
    assert len(packed) == 2  # 999 nodes that follow one failure: one entry
    with pytest.raises(ValueError, match="a list"):
        unpack({"nodes": []})
    with pytest.raises(ValueError, match="without nodes"):
        unpack([{"action": "restart"}])
    with pytest.raises(ValueError, match=r"\[rank, host\]"):
        unpack([{"action": "restart", "nodes": [3]}])
    for rank in (True, "1", 1.0, None):  # what the group shares is read once, each node's rank each time
        with pytest.raises(ValueError, match=r"node_rank .* is not an integer"):
            unpack([{"action": "restart", "nodes": [[0, "h0"], [rank, "h1"]]}])
    with pytest.raises(ValueError, match="'action'"):  # a group's shared fields are still checked
        unpack([{"nodes": [[0, "h0"]]}])
    assert unpack(packed) == [failed, *followers]


def test_a_large_job_looks_at_the_rendezvous_less_often_per_node() -> None:
    assert look_every(2, floor=1.0, job_per_second=100.0) == 1.0  # as before: once a second
    assert look_every(100, floor=1.0, job_per_second=100.0) == 1.0
    assert look_every(1024, floor=1.0, job_per_second=100.0) == pytest.approx(10.24)  # the job: 100/s


@pytest.mark.parametrize("nnodes", [2, 4, 64, 256, 1024])
def test_the_job_asks_whether_the_others_succeeded_a_bounded_number_of_times_a_second(nnodes: int) -> None:
    # as the daemon's watch uses it: 2 s at least, the job about 20 times a second (job.py)
    look = look_every(nnodes, floor=1.0, job_per_second=20.0)
    period = ask_others_every(nnodes, look, floor=2.0, job_per_second=20.0) * look  # seconds, per node
    assert period >= 2.0 - look / 2  # a small job as before: every 2 s (2 looks of 1 s)
    assert nnodes / period <= 20.0 * 1.25  # the whole job's questions a second (rounded to whole looks)
    if nnodes <= 4:
        assert period == 2.0
