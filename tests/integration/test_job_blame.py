"""A hang across the job (issue 26): two daemons on loopback, two gloo ranks each, the
rendezvous store hosted by the test (as tests/integration/test_multinode.py does).

Every node gathers its ranks' stacks and Flight Recorder dumps (gloo's, dumped by the
ranks' clients), publishes its summary through the store and computes the same blame:
the culprit's node is charged (named hung, its ledger marked), the waiting node follows
(``peer_failed``), and reason.json names the same culprit on both. A desync aborts on its
first occurrence. The agreement's corner cases (a silent node, a late summary, both
nodes declaring at once) are tests/fast/test_job_blame_fast.py's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import RANKS, Daemon

pytestmark = [pytest.mark.torch, pytest.mark.slow]
Start = Callable[..., Daemon]
SCRIPT = str(RANKS / "job_hang.py")


def _node(endpoint: str, tmp: Path, n: int, restarts: str) -> list[str]:
    conf = "is_host=0,keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=60"
    return [
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
        "--local-addr", "127.0.0.1", "--rdzv-conf", conf, "--max-restarts", restarts, "--no-standby",
        "--ft-rank-section-timeouts", "step:2", "--node-state-dir", str(tmp / f"state{n}"),
    ]  # fmt: skip


def _by_node(daemons: list[Daemon]) -> dict[int, Daemon]:
    out = {}
    for d in daemons:
        (joined, *_) = d.wait_event("rendezvous_joined", 90, where=lambda e: e["generation"] == 0)
        out[joined["node_rank"]] = d
    return out


def _reason(d: Daemon) -> dict[str, Any]:
    return json.loads((d.run_dir() / "reason.json").read_text())  # type: ignore[operator,no-any-return]


def test_rank_3_stuck_in_its_own_code_is_blamed_on_every_node_and_only_node_1_is_charged_then_a_desync_aborts(
    start: Start, endpoint: str, tmp_path: Path
) -> None:
    """One job, two proofs (each job costs four torch ranks and two daemons importing torch).

    Generation 0: rank 3 (node 1) sleeps in its step while ranks 0-2 wait in the all_reduce:
    alone, node 0 would name its own waiting ranks (it sees nobody else). Both nodes name
    rank 3 on node 1; node 1 records the hang and marks its ledger, node 0 follows its peer.

    Generation 1: rank 3 calls all_gather where ranks 0-2 call all_reduce: a program error,
    aborted on its first occurrence (a restart was left), the mismatch named on every node."""
    daemons = [start(*_node(endpoint, tmp_path, n, "2"), SCRIPT, "--fault", "both") for n in range(2)]
    assert [d.wait(200) for d in daemons] == [2, 2], daemons[0].story() + daemons[1].story()
    nodes = _by_node(daemons)
    for d in daemons:
        first, second = d.events("job_blame")
        assert (first["generation"], first["ranks"], first["nodes"], first["silent"]) == (0, [3], [1], [])
        assert first["rule"] in ("wavefront", "own_code") and first["summaries"] == [0, 1], first
        assert first["seconds"] < 10, first
        assert (second["generation"], second["rule"], second["ranks"]) == (1, "desync", [3]), second
        assert second["nodes"] == [1], second
    # node 1 names its rank 3 hung, by the job's blame, and its ledger is marked
    hung = [h for h in nodes[1].events("rank_hung") if h["generation"] == 0]
    assert [(h["rank"], h["blamed_by"]) for h in hung] == [(3, "job_blame")], hung
    assert [m["kind"] for m in nodes[1].events("node_health_marked")][:1] == ["hang"]
    # node 0 charges none of its ranks: it follows its peer, naming the culprit
    assert [h for h in nodes[0].events("rank_hung") if h["generation"] == 0] == []
    assert nodes[0].events("node_health_marked") == []
    (decided,) = [e for e in nodes[0].events("decision") if e["generation"] == 0]
    assert decided["reason"] == "peer_failed" and "rank(s) 3 on node(s) 1" in decided["detail"], decided
    # the bundle of a node that declared the hang holds every node's summary and the verdict
    for d in daemons:
        for event in d.events("hang_bundle"):
            if event["generation"] == 0:
                job = json.loads((Path(event["path"]) / "job-blame.json").read_text())
                assert job["verdict"]["ranks"] == [3] and [s["node_rank"] for s in job["summaries"]] == [0, 1]
    # the desync: aborted at its first occurrence, reason.json names it the same on every node
    for d in daemons:
        reason = _reason(d)
        assert reason["outcome"] == "abort" and reason["restarts_used"] == 1, reason
        blamed = reason["job_blame"]
        assert (blamed["rule"], blamed["ranks"], blamed["nodes"]) == ("desync", [3], [1]), blamed
        calls = {c["rank"]: c for c in blamed["mismatch"]["calls"]}
        assert calls[3]["op"] == "all_gather" and calls[0]["op"] == "all_reduce", calls
        assert "all_gather" in reason["decision"]["detail"] and reason["decision"]["action"] == "abort"
        assert not [e for e in d.events("generation_started") if e["generation"] == 2]
