"""A node's summary of a hang: built from real dumps (gloo on CPU, torch 2.13; NCCL on an H200),
carried as bounded canonical JSON, read back from a peer without trusting it."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.node_summary import (
    LIMIT,
    Call,
    Group,
    NodeSummary,
    RankEvidence,
    RankState,
    decode,
    encode,
    from_json,
    summarize_node,
    to_json,
)
from supervisor.core.stacks import read
from supervisor.process.native import read_flight_dump

FLIGHT = Path(__file__).resolve().parent.parent / "fixtures" / "flight"
WAITING_STACKS = (FLIGHT.parent / "stacks" / "allreduce_rank0.txt").read_text()


def gloo(case: str, rank: int) -> RankEvidence:
    """One rank of a gloo fixture (tests/fixtures/flight/make_gloo.py): its dump and its stacks."""
    dump = FLIGHT / f"gloo_{case}_rank_{rank}.pkl"
    if not dump.exists():  # gloo aborted the process (a size mismatch it noticed)
        return RankEvidence(rank, gone=True)
    stacks = read((FLIGHT / f"gloo_{case}_rank_{rank}.stacks.txt").read_text())
    return RankEvidence(rank, dump=pickle.loads(dump.read_bytes()), reading=stacks)


def test_a_gloo_rank_waiting_in_the_all_reduce_and_the_one_in_its_own_code() -> None:
    s = summarize_node(1, "host-b", "g0:1", 0, [gloo("own_code", 3), gloo("own_code", 2)])
    waiting, stuck = s.ranks[0], s.ranks[1]
    assert (waiting.rank, waiting.where, stuck.rank, stuck.where) == (2, "collective", 3, "own")
    assert waiting.why == "all_reduce in distributed/distributed_c10d.py"
    (g,) = waiting.groups or ()
    assert (g.name, g.desc, g.started) == ("0", "default_pg", None)  # gloo never records a start
    assert g.enqueued is not None and g.completed is not None
    assert (g.enqueued.seq, g.enqueued.op, g.enqueued.sizes) == (4, "all_reduce", ((8,),))
    assert str(g.enqueued.at).endswith("flight/make_gloo.py:99 step")
    assert (g.completed.seq, g.completed.op) == (3, "broadcast")
    assert g.waiting
    (g3,) = stuck.groups or ()
    assert g3.enqueued == g3.completed and g3.enqueued is not None and g3.enqueued.seq == 3
    assert not g3.waiting


def test_the_h200_captures_say_the_all_reduce_was_never_started() -> None:
    for name in ("h200_hang_rank_0.pkl", "h200_timeout_rank_0.pkl"):
        dump, _ = read_flight_dump(FLIGHT / name)
        (rank,) = summarize_node(0, "gpu", "g0:1", 0, [RankEvidence(0, dump=dump)]).ranks
        assert rank.where == "unknown"
        (g,) = rank.groups or ()
        assert g == Group(
            "0",
            "default_pg",
            Call(1, "all_reduce", ((1024,),), "/work/main/scripts/gpu/faults.py:83 main"),
            None,
            None,
        )
        assert g.waiting


def test_a_rank_that_exited_or_gave_no_dump_says_so() -> None:
    s = summarize_node(
        0, "a", "i", 0, [RankEvidence(1, gone=True), RankEvidence(0, dump_error="no dump within 2 s")]
    )
    assert [(r.rank, r.where, r.groups, r.dump_error) for r in s.ranks] == [
        (0, "unknown", None, "no dump within 2 s"),
        (1, "gone", None, None),
    ]


def test_a_rank_stands_where_its_stacks_said_while_it_lived_and_its_exit_says_when() -> None:
    waited = "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)"
    s = summarize_node(0, "a", "i", 0, [
        RankEvidence(0, reading=read(WAITING_STACKS), gone=True, after=True),  # read, then it exited
        RankEvidence(1, gone=True, waited=waited),  # it said it waited: a waiting one, gone or not
        RankEvidence(2, gone=True, after=True),  # exited after the incident began: because of it
        RankEvidence(3, gone=True),  # before: the most suspect place
    ])  # fmt: skip
    assert [(r.rank, r.where) for r in s.ranks] == [(0, "collective"), (1, "collective"), (2, "ended"),
                                                    (3, "gone")]  # fmt: skip
    assert s.ranks[1].why == f"timed out waiting: {waited}"
    assert decode(encode(s)) == s


def test_the_wire_form_round_trips_and_is_canonical() -> None:
    s = summarize_node(1, "b", "g0:1", 0, [gloo("subgroup", r) for r in (1, 0)])
    assert decode(encode(s)) == s
    assert encode(s) == encode(decode(encode(s)))  # type: ignore[arg-type]
    assert len(encode(s)) < 4096  # a node of 2 ranks: a few hundred bytes a rank


def _big(n: int) -> NodeSummary:
    call = Call(7, "all_reduce", ((1024, 1024),) * 8, "/a/very/long/path/" * 8 + "train.py:1 step")
    groups = tuple(Group(str(g), "desc", call, None, call) for g in range(8))
    return NodeSummary(
        0, "a", "i", 0, tuple(RankState(r, "collective", "all_reduce in x", 1, groups) for r in range(n))
    )


def test_a_summary_over_the_bound_loses_call_sites_then_its_highest_ranks_and_says_so() -> None:
    small = _big(4)
    assert decode(encode(small)) == small and small.truncated is None
    big = _big(64)
    data = encode(big)
    assert len(data) <= LIMIT
    cut = decode(data)
    assert cut is not None and cut.truncated is not None
    kept = [r.rank for r in cut.ranks]
    assert kept == list(range(len(kept))) and 0 < len(kept) < 64
    assert cut.truncated == f"call sites dropped; ranks {len(kept)}-63 dropped ({64 - len(kept)})"
    assert all(g.enqueued is not None and g.enqueued.at is None for r in cut.ranks for g in r.groups or ())
    assert encode(big) == data  # the same summary loses the same parts
    only_sites = encode(_big(20))
    assert len(only_sites) <= LIMIT and b"dropped (" not in only_sites and b"call sites dropped" in only_sites


def test_a_peer_payload_that_is_not_a_summary_is_refused() -> None:
    assert decode(b"not json") is None
    assert decode(b"\xff\xfe") is None
    good = to_json(summarize_node(0, "a", "i", 0, [gloo("own_code", 0)]))
    assert from_json({**good, "version": 99}) is None
    odd = {**good, "ranks": [{"rank": "zero"}, {"rank": 5, "where": "mars", "groups": [{"name": 3}, "x"]}]}
    parsed = from_json(odd)
    assert parsed is not None and parsed.ranks == (RankState(5, "unknown", None, None, ()),)


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=80, deadline=None)  # each CI run draws anew
@given(
    st.fixed_dictionaries(
        {
            "version": st.just(1),
            "node_rank": st.integers(),
            "generation": st.integers(),
            "ranks": st.lists(
                st.dictionaries(st.sampled_from(["rank", "where", "groups", "iteration", "why"]), plain),
                max_size=3,
            ),
        }
    )
    | plain
)
def test_any_plain_data_from_a_peer_is_read_without_raising(data: Any) -> None:
    s = from_json(data)
    if s is not None:
        assert decode(encode(s)) is not None


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["pg_config", "pg_status", "entries"]), plain) | plain)
def test_any_plain_dump_is_summarised_without_raising(dump: Any) -> None:
    s = summarize_node(0, "a", "i", 0, [RankEvidence(0, dump=dump)])
    assert decode(encode(s)) is not None
