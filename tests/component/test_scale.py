"""What the job-wide agreement costs the store, measured by the scale harness at a small N.

``scripts/bench/scale.py`` runs simulated nodes (the real ``RendezvousJob``, no
ranks) against a real TCPStore behind a counting proxy. Before, every node polled
the round's "ended" key every 0.1 s and read the whole node table every second:
about 37 requests a second a node at 8 nodes, 2 N + 11 in general. Now a node
waits on the key (the store answers when it is set) and reads the table only when
``status`` asks, and one node gathers the round's outcomes for all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.coord.nodetable import SAMPLE_BUDGET, SAMPLE_NODES, sample_every
from tests.support import REPO

pytestmark = [pytest.mark.torch, pytest.mark.slow]
NODES = 8


def test_nodes_at_rest_cost_the_store_little_and_all_hear_a_failure_at_once(tmp_path: Path) -> None:
    out, err = tmp_path / "scale.json", tmp_path / "scale.stderr"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench" / "scale.py"), "--nodes", str(NODES),
         "--rest", "2", "--settle", "1", "--json", str(out), "--stderr", str(err)],
        capture_output=True, text=True, timeout=100, env=env, check=False,
    )  # fmt: skip
    assert run.returncode == 0 and out.exists(), run.stderr + err.read_text()[-3000:]
    results = json.loads(out.read_text())[str(NODES)]
    assert results, run.stderr + err.read_text()[-3000:]
    r = results[0]
    assert r["same_decision"], r
    # a look at torch's state a second (a wait and a get) and torch's keep-alive: ~3 a node
    assert r["rest_rps"] < 5 * NODES, r
    assert r["learn_s"] < 1.0 and r["agree_s"] < 2.0, r
    # the failure round: an announcement, and per node a claim, an outcome, a count
    # and the round's decision read once, not every node reading every other's outcome
    assert r["failure_requests"] < 12 * NODES, r


def test_straggler_medians_are_read_from_a_sample_of_nodes_within_a_job_wide_budget() -> None:
    """Every node reading every other node's medians would cost N^2 requests a round
    (2 million at 1,024 nodes): a node reads SAMPLE_NODES others, so often that the
    whole job stays within SAMPLE_BUDGET requests a second whatever its size."""
    for nnodes in (1, 2, 8, 64, 256, 1024, 4096):
        job_rate = nnodes * 2 * SAMPLE_NODES / sample_every(nnodes)
        assert job_rate <= SAMPLE_BUDGET, nnodes
    assert sample_every(2) == 1.0 and sample_every(1024) == 40.96
