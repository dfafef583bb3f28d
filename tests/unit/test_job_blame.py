"""One blame for the job from every node's summary: real gloo dumps made on CPU (torch 2.13,
tests/fixtures/flight/make_gloo.py), the H200 NCCL captures, and the 2- and 4-node cases of
issue 26 built by hand. Every node must reach the same answer whatever order it reads them in."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.job_blame import JobBlame, job_blame, to_json
from supervisor.core.node_summary import (
    Call,
    Group,
    NodeSummary,
    RankEvidence,
    RankState,
    decode,
    encode,
    summarize_node,
)
from supervisor.core.stacks import Reading, Where
from supervisor.process.native import read_flight_dump
from tests.unit.test_node_summary import FLIGHT, gloo

TWO = {0: [0, 1], 1: [2, 3]}  # two nodes of two ranks
FOUR = {0: [0], 1: [1], 2: [2], 3: [3]}


def nodes(evidence: Sequence[RankEvidence], layout: dict[int, list[int]]) -> list[NodeSummary]:
    """Each node's summary, through the wire form a peer would receive."""
    by_rank = {e.rank: e for e in evidence}
    out = []
    for n, ranks in layout.items():
        s = decode(
            encode(summarize_node(n, f"host-{n}", "g0:1", 0, [by_rank[r] for r in ranks if r in by_rank]))
        )
        assert s is not None
        out.append(s)
    return out


@pytest.mark.parametrize(
    ("case", "culprit", "rule"),
    [
        ("own_code", 3, "wavefront"),  # sleeps in its own code while 0-2 wait in the all_reduce
        ("before", 1, "wavefront"),  # blocked on a read before its all_reduce
        ("subgroup", 3, "wavefront"),  # rank 0 behind too, but it waits in group 1 for rank 1
        ("desync_op", 2, "desync"),
        ("desync_size", 2, "desync"),  # gloo aborted rank 1 itself; the dumps still tell
    ],
)
@pytest.mark.parametrize("layout", [TWO, FOUR], ids=["2 nodes", "4 nodes"])
def test_real_gloo_dumps_name_the_culprit_and_its_node(
    case: str, culprit: int, rule: str, layout: dict[int, list[int]]
) -> None:
    found = job_blame(nodes([gloo(case, r) for r in range(4)], layout), layout)
    assert (found.ranks, found.rule) == ((culprit,), rule)
    assert found.nodes == tuple(n for n, rs in layout.items() if culprit in rs)
    assert found.silent == ()


def test_a_desync_names_the_ops_sizes_and_call_sites() -> None:
    found = job_blame(nodes([gloo("desync_op", r) for r in range(4)], TWO), TWO)
    m = found.mismatch
    assert m is not None and (m.group, m.seq) == ("0", 4)
    assert [(r, op, sizes) for r, op, sizes, _ in m.calls] == [
        (0, "all_reduce", "[8]"),
        (1, "all_reduce", "[8]"),
        (2, "all_gather", "[8]"),
        (3, "all_reduce", "[8]"),
    ]
    assert str(m.calls[2][3]).endswith("make_gloo.py:88 step")
    assert (
        "rank(s) 2 called all_gather [8]" in found.detail
        and "rank(s) 0, 1, 3 called all_reduce" in found.detail
    )
    sized = job_blame(nodes([gloo("desync_size", r) for r in range(4)], TWO), TWO)
    assert "called all_reduce [16]" in sized.detail and "rank(s) 0, 3 called all_reduce [8]" in sized.detail
    assert to_json(sized)["mismatch"]["calls"][1]["sizes"] == "[16]"  # rank 1 exited: no call


def test_every_node_reaches_the_same_blame_in_any_order() -> None:
    evidence = [gloo("subgroup", r) for r in range(4)]
    for layout in (TWO, FOUR, {0: [3, 1], 1: [0, 2]}):
        summaries = nodes(evidence, layout)
        seen = {repr(job_blame(list(p), layout)) for p in itertools.permutations(summaries)}
        assert len(seen) == 1


def stacks(where: Where, why: str = "") -> Reading:
    return Reading(where, (), why or where.name.lower())


def hand(
    layout: dict[int, list[int]],
    where: dict[int, Where],
    iteration: dict[int, int] | None = None,
    answered: Sequence[int] | None = None,
) -> list[NodeSummary]:
    """Summaries without a Flight Recorder (no dump): stacks and progress only."""
    it = iteration or {}
    ev = [RankEvidence(r, reading=stacks(w), iteration=it.get(r)) for r, w in where.items()]
    return [s for s in nodes(ev, layout) if answered is None or s.node_rank in answered]


def test_issue_26_two_nodes_rank_3_in_its_own_code_while_0_to_2_wait() -> None:
    # measured in issue 26: node 0 alone blamed its own waiting ranks 0 and 1
    w = {0: Where.COLLECTIVE, 1: Where.COLLECTIVE, 2: Where.COLLECTIVE, 3: Where.OWN}
    found = job_blame(hand(TWO, w), TWO)
    assert (found.ranks, found.nodes, found.rule, found.waiting) == ((3,), (1,), "own_code", (0, 1, 2))
    # a stopped rank is more suspect than one in its own code; backward counts as waiting
    w = {0: Where.COMPUTE, 1: Where.OWN, 2: Where.STOPPED, 3: Where.COLLECTIVE}
    assert job_blame(hand(FOUR, w), FOUR).ranks == (2,)
    # two ranks in their own code with nobody waiting: nothing to tell
    w = {0: Where.OWN, 1: Where.OWN, 2: Where.OWN, 3: Where.OWN}
    assert job_blame(hand(FOUR, w), FOUR).rule == "undetermined"


def test_a_rank_without_a_dump_that_every_other_rank_waits_for_is_absent() -> None:
    ev = [gloo("own_code", r) for r in range(3)] + [
        RankEvidence(3, reading=stacks(Where.STOPPED, "stopped (SIGSTOP)"))
    ]
    found = job_blame(nodes(ev, TWO), TWO)
    assert (found.ranks, found.nodes, found.rule) == ((3,), (1,), "absent")
    assert "rank 3: stopped (stopped (SIGSTOP))" in found.detail
    # node 1 gave stacks but no dumps: of its ranks, the one not waiting by its stacks
    bare = [
        *ev[:2],
        RankEvidence(2, reading=stacks(Where.COLLECTIVE)),
        RankEvidence(3, reading=stacks(Where.OWN)),
    ]
    assert job_blame(nodes(bare, TWO), TWO).ranks == (3,)
    # node 1 never answered: its ranks are the ones node 0's ranks wait for
    found = job_blame(nodes(ev, TWO)[:1], TWO)
    assert (found.ranks, found.nodes, found.rule, found.silent) == ((2, 3), (1,), "absent", (1,))
    assert "node(s) 1 did not answer" in found.detail


def test_a_stopped_rank_outranks_the_ranks_that_exited_because_of_the_incident() -> None:
    # measured (scripts/bench/blame.py, sigstop): the ranks that exited meanwhile were
    # ``gone``, ranked above the stopped one, and the job named ranks that had succeeded
    ended = [RankEvidence(r, gone=True, after=True) for r in (0, 2, 3)]
    ev = [RankEvidence(1, reading=stacks(Where.STOPPED, "stopped (SIGSTOP)")), *ended]
    found = job_blame(nodes(ev, TWO), TWO)
    assert (found.ranks, found.nodes, found.rule) == ((1,), (0,), "own_code"), found
    # with the others' dumps: the stopped rank gave none, and is the one waited for; a rank
    # that exited after the incident gave none either, and is never named for it
    dumped = [gloo("own_code", r) for r in (0, 1)]
    ev = [*dumped, RankEvidence(2, gone=True, after=True), RankEvidence(3, reading=stacks(Where.STOPPED))]
    found = job_blame(nodes(ev, TWO), TWO)
    assert (found.ranks, found.nodes, found.rule) == ((3,), (1,), "absent"), found
    # a rank that exited before the incident began is still the most suspect of all
    ev = [RankEvidence(0, gone=True), RankEvidence(1, reading=stacks(Where.STOPPED)),
          *(RankEvidence(r, reading=stacks(Where.COLLECTIVE)) for r in (2, 3))]  # fmt: skip
    assert job_blame(nodes(ev, TWO), TWO).ranks == (0,)
    # nobody but ranks that ended and ranks that wait: nothing stands apart
    ev = [*ended, RankEvidence(1, reading=stacks(Where.COLLECTIVE))]
    assert job_blame(nodes(ev, TWO), TWO).undetermined


def test_a_rank_that_timed_out_waiting_is_a_waiting_one() -> None:
    line = "RuntimeError: [unbound_buffer.cc:81] Timed out waiting 5000ms for recv operation to complete"
    ev = [RankEvidence(0, gone=True, waited=line), RankEvidence(1, reading=stacks(Where.COLLECTIVE)),
          RankEvidence(2, reading=stacks(Where.COLLECTIVE)),
          RankEvidence(3, reading=stacks(Where.OWN))]  # fmt: skip
    found = job_blame(nodes(ev, TWO), TWO)
    assert (found.ranks, found.nodes, found.rule, found.waiting) == ((3,), (1,), "own_code", (0, 1, 2))


def test_a_silent_node_is_blamed_when_nothing_else_tells() -> None:
    w = {0: Where.COLLECTIVE, 1: Where.COLLECTIVE, 2: Where.OWN, 3: Where.COLLECTIVE}
    found = job_blame(hand(FOUR, w, answered=[0, 1, 3]), FOUR)
    assert (found.ranks, found.nodes, found.rule, found.silent) == ((2,), (2,), "node_silent", (2,))
    found = job_blame([], TWO)
    assert (found.ranks, found.nodes, found.rule) == ((0, 1, 2, 3), (0, 1), "node_silent")


def test_the_rank_behind_in_iterations_when_the_stacks_tell_nothing() -> None:
    w = dict.fromkeys(range(4), Where.COLLECTIVE)
    found = job_blame(hand(TWO, w, iteration={0: 9, 1: 9, 2: 8, 3: 9}), TWO)
    assert (found.ranks, found.nodes, found.rule) == ((2,), (1,), "progress")
    assert job_blame(hand(TWO, w, iteration=dict.fromkeys(range(4), 9)), TWO).undetermined


def test_the_h200_capture_waits_for_a_rank_on_another_node() -> None:
    dump, _ = read_flight_dump(FLIGHT / "h200_hang_rank_0.pkl")
    waiting = RankEvidence(0, dump=dump, reading=stacks(Where.COLLECTIVE))
    # its peer on node 1 enqueued nothing yet: it is in its own code before the all_reduce
    late = RankEvidence(
        1,
        dump={
            "pg_status": {
                "0": {
                    "last_enqueued_collective": 0,
                    "last_started_collective": -1,
                    "last_completed_collective": 0,
                }
            }
        },
        reading=stacks(Where.OWN),
    )
    layout = {0: [0], 1: [1]}
    found = job_blame(nodes([waiting, late], layout), layout)
    assert (found.ranks, found.nodes, found.rule) == ((1,), (1,), "wavefront")
    # its peer's node did not answer
    found = job_blame(nodes([waiting], {0: [0]}), layout)
    assert (found.ranks, found.nodes, found.rule, found.silent) == ((1,), (1,), "absent", (1,))


def _summary(node: int, ranks: dict[int, tuple[str, int, int, str]]) -> NodeSummary:
    """A node whose ranks each report one group: (op, enqueued seq, completed seq, where)."""
    states = tuple(
        RankState(
            r,
            where,
            None,
            None,
            (Group("0", "default_pg", Call(enq, op, ((4,),)), None, Call(done, op, ((4,),))),),
        )
        for r, (op, enq, done, where) in sorted(ranks.items())
    )
    return NodeSummary(node, f"h{node}", "i", 0, states)


def test_sizes_are_compared_only_where_the_inputs_must_agree() -> None:
    a = _summary(0, {0: ("all_to_all", 5, 4, "collective")})
    b = NodeSummary(
        1,
        "h1",
        "i",
        0,
        (
            RankState(
                1,
                "collective",
                None,
                None,
                (Group("0", None, Call(5, "all_to_all", ((8,),)), None, Call(4)),),
            ),
        ),
    )
    assert job_blame([a, b], {0: [0], 1: [1]}).rule == "undetermined"


def test_a_two_way_desync_with_no_majority_names_both_ranks_whatever_their_numbers() -> None:
    for a, b in (("all_reduce", "broadcast"), ("broadcast", "all_reduce")):
        s = [_summary(0, {0: (a, 5, 4, "collective"), 1: (b, 5, 4, "collective")})]
        found = job_blame(s, {0: [0, 1]})
        assert (found.ranks, found.rule) == ((0, 1), "desync") and "no majority" in found.detail


# what gloo's rank 1 said as it aborted in the desync_size capture (tests/fixtures/flight), and
# what a peer says when the rank it was connected to went away
CAUGHT = (
    "  what():  [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] "
    "op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match expected size. "
    "Is there a distributed collective mismatch in your code?"
)
CLOSED = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:18350. This is typically caused by a remote worker crashing."
)


def sized(rank: int, witness: str | None = None) -> RankEvidence:
    """A rank of the real desync_size capture (rank 2 all-reduced 16 floats, the others 8;
    gloo aborted rank 1), or a witness of it: gone, its line blaming a peer."""
    if witness is not None:
        return RankEvidence(rank, gone=True, after=True, witness=witness)
    return gloo("desync_size", rank)


def test_a_rank_that_caught_a_size_mismatch_is_a_witness_and_tips_a_tie_to_the_smaller_call() -> None:
    """Two dumps left, rank 0's [8] and rank 2's [16]: no majority by the dumps. Rank 1's
    receive caught the mismatch (8 bytes sent where it expected 4): it held the smaller
    buffer, so it counts for [8], and rank 2 is named (not rank 0, the lower number)."""
    found = job_blame(nodes([sized(0), sized(1, CAUGHT), sized(2), sized(3, CLOSED)], TWO), TWO)
    assert (found.rule, found.ranks, found.nodes) == ("desync", (2,), (1,)), found
    assert "caught the mismatch" in found.detail
    # without its word the tie names both ranks, favouring neither
    found = job_blame(nodes([sized(0), sized(1, CLOSED), sized(2), sized(3, CLOSED)], TWO), TWO)
    assert (found.rule, found.ranks) == ("desync", (0, 2)), found


def test_when_only_witnesses_are_left_beside_the_culprit_the_rank_that_blamed_nobody_is_named() -> None:
    """The ranks that could tell the sizes apart exited first (gloo aborted rank 1, ranks 0 and 3
    saw their connections close): only rank 2's dump is left. The witnesses are not culprits."""
    for layout in (TWO, FOUR):
        evidence = [sized(0, CLOSED), sized(1, CAUGHT), sized(2), sized(3, CLOSED)]
        found = job_blame(nodes(evidence, layout), layout)
        assert (found.rule, found.ranks) == ("desync", (2,)), found
        assert found.nodes == tuple(n for n, rs in layout.items() if 2 in rs)
        assert "rank 2: all_reduce [16]" in found.detail, found.detail
        # the witnesses' words are in their node's summary, through the wire form
        (rank1,) = [r for s in nodes(evidence, layout) for r in s.ranks if r.rank == 1]
        assert rank1.where == "collective" and rank1.witness == (
            "what():  op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match "
            "expected size. Is there a distributed collective mismatch in your code?"
        )
    # the culprit's own collective was reset too (rank 1's abort closed it): its dump still tells
    reset = replace(sized(2), witness=CLOSED)
    found = job_blame(nodes([sized(0, CLOSED), sized(1, CAUGHT), reset, sized(3, CLOSED)], TWO), TWO)
    assert (found.rule, found.ranks, found.nodes) == ("desync", (2,), (1,)), found
    # the culprit's dump did not come (its collective was reset and it was going down), two
    # ranks agree on [8]: the rank whose call is unknown is named, not the one that blamed nobody
    # (scripts/bench/blame.py named rank 2 that way, waiting in [8], when rank 1 sent [16])
    gone = RankEvidence(2, gone=True, after=True, witness=CLOSED)
    found = job_blame(nodes([sized(0), sized(1, CAUGHT), gone, replace(sized(3), witness=CLOSED)], TWO), TWO)
    assert (found.rule, found.ranks, found.nodes) == ("desync", (2,), (1,)), found
    assert "rank(s) 0, 3 agree at the front" in found.detail, found.detail
    # without a rank that caught a mismatch, peers' resets alone make no desync
    found = job_blame(nodes([sized(0, CLOSED), sized(1, CLOSED), sized(2)], TWO), TWO)
    assert found.rule != "desync"


def test_nodes_running_different_numbers_of_ranks_are_placed_by_their_own_summaries() -> None:
    """Node 0 runs ranks 0-2, node 1 ranks 3-4: a node that assumes its own 2 ranks per node
    (ranks 2-3 on node 1) must still place rank 2 on node 0, as node 0's summary says."""
    layout = {0: [0, 1, 2], 1: [3, 4]}
    assumed = {0: [0, 1], 1: [2, 3]}  # what nproc_per_node=2 gives on node 1
    where = {0: Where.COLLECTIVE, 1: Where.COLLECTIVE, 2: Where.OWN, 3: Where.COLLECTIVE, 4: Where.COLLECTIVE}
    found = job_blame(hand(layout, where), assumed)
    assert (found.rule, found.ranks, found.nodes, found.silent) == ("own_code", (2,), (0,), ())
    where = {0: Where.COLLECTIVE, 1: Where.COLLECTIVE, 2: Where.COLLECTIVE, 3: Where.COLLECTIVE, 4: Where.OWN}
    found = job_blame(hand(layout, where), {0: [0, 1, 2], 1: [3, 4, 5]})  # node 1 assuming 3 each
    assert (found.ranks, found.nodes) == ((4,), (1,))
    # a silent node: only the ranks nobody reported are its own
    found = job_blame(hand(layout, where, answered=[0]), assumed)
    assert (found.rule, found.ranks, found.nodes, found.silent) == ("node_silent", (3,), (1,), (1,))


@settings(max_examples=80, deadline=None)  # each CI run draws anew
@given(
    st.dictionaries(
        st.integers(0, 7),
        st.tuples(
            st.sampled_from(["all_reduce", "all_gather"]),
            st.integers(0, 3),
            st.integers(0, 3),
            st.sampled_from(["own", "collective", "stopped", "unknown"]),
        ),
        max_size=8,
    ),
    st.randoms(use_true_random=False),
)
def test_any_summaries_give_one_answer_whatever_their_order(
    ranks: dict[int, tuple[str, int, int, str]], rnd: object
) -> None:
    layout = {r // 2: [r - r % 2, r - r % 2 + 1] for r in range(8)}
    summaries = [_summary(n, {r: v for r, v in ranks.items() if r // 2 == n}) for n in range(4) if n != 3]
    first = job_blame(summaries, layout)
    shuffled = list(reversed(summaries))
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert job_blame(shuffled, layout) == first
    assert isinstance(first, JobBlame) and set(first.ranks) <= set(range(8)) and first.silent == (3,)
