"""What a node does with the job's blame (supervisor.core.job_verdict): pure."""

from __future__ import annotations

from supervisor.core.job_blame import JobBlame, Mismatch
from supervisor.core.job_verdict import (
    culprits_here,
    desync_decision,
    expected_nodes,
    followed,
    reason_fields,
)
from supervisor.core.types import Action, Reason

HANG = JobBlame((3,), (1,), "own_code", "rank 3: own (sleep)", waiting=(0, 1, 2))
DESYNC = JobBlame(
    (3,), (1,), "desync", "group 0 collective #7: rank(s) 3 called all_gather [8] where ...",
    mismatch=Mismatch("0", 7, ((0, "all_reduce", "[8]", None), (3, "all_gather", "[8]", "t.py:9 main"))),
)  # fmt: skip


def test_every_node_places_the_ranks_as_torchrun_does() -> None:
    assert expected_nodes(2, 2) == {0: [0, 1], 1: [2, 3]}


def test_only_the_culprits_that_run_here_are_charged_here() -> None:
    assert culprits_here(HANG, [2, 3]) == (3,)
    assert culprits_here(HANG, [0, 1]) == ()


def test_a_node_that_follows_names_the_culprit_rank_and_node() -> None:
    assert followed(HANG, {1: "host-b"}).startswith("job blame (own_code): rank(s) 3 on node(s) 1 (host-b): ")


def test_a_desync_aborts_naming_the_mismatch_and_a_hang_does_not() -> None:
    decision = desync_decision(reason_fields(DESYNC))
    assert decision is not None and (decision.action, decision.reason) == (Action.ABORT, Reason.NOT_RETRYABLE)
    assert "all_gather [8]" in decision.detail
    assert desync_decision(reason_fields(HANG)) is None


def test_reason_json_gets_rule_ranks_nodes_detail_and_for_a_desync_the_mismatch() -> None:
    assert reason_fields(HANG) == {
        "rule": "own_code", "ranks": [3], "nodes": [1], "detail": "rank 3: own (sleep)", "silent": [],
    }  # fmt: skip
    calls = reason_fields(DESYNC)["mismatch"]["calls"]
    assert calls[1] == {"rank": 3, "op": "all_gather", "sizes": "[8]", "at": "t.py:9 main"}
