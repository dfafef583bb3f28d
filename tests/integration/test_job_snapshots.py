"""Snapshots across nodes (issue 25): two daemons on loopback as one job, a rank each,
snapshotting every step; each daemon replicates its rank's snapshots to the other. The
whole second node (its daemon and its rank) is SIGKILLed and started again with nothing
in memory: its rank restores from the replica the first node kept, the first node's
from its own memory, the same step, bit for bit. The pieces on their own (the agreement,
the wire, a peer gone mid-copy) are tests/unit/test_job_snapshots.py's."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_multinode import joined, node
from tests.support import RANKS, Daemon, wait_until

pytestmark = [pytest.mark.torch, pytest.mark.slow]
Start = Callable[..., Daemon]
NODES = str(RANKS / "snapshot_nodes.py")
# the ranks stop after this step's snapshot, until node 1 is killed: a step on any grid the
# replication may widen to (1, 2, 4, 8: a copy that ends steps behind on a loaded machine)
HOLD_AT = 8
STEPS = 10


def replicated(d: Daemon, rank: int) -> int | None:
    """The newest step of ``rank`` the daemon's peer keeps, from its status."""
    out = subprocess.run([sys.executable, "-m", "supervisor", "status", "--pid", str(d.pid), "--json"],
                         capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    try:
        ranks = json.loads(out.stdout)["snapshots"]["replication"]["ranks"]
        step = ranks[str(rank)]["replicated_step"]
    except (ValueError, KeyError, TypeError):
        return None
    return step if isinstance(step, int) else None


def restored(out: Path) -> dict[str, dict[str, Any]]:
    return {f.name: json.loads(f.read_text()) for f in sorted(out.glob("restored.*.json"))}


def test_a_killed_node_restores_from_its_peers_replica(start: Start, endpoint: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ranks = (NODES, "--steps", str(STEPS), "--step-time", ".05", "--out", f"{out}", "--hold-at", f"{HOLD_AT}")
    args = (*node(endpoint), "--snapshot-memory", "64M", *ranks)
    d0, d1 = start(*args), start(*args)
    first = {joined(d)["node_rank"]: d for d in (d0, d1)}
    survivor, lost = first[0], first[1]
    # both ranks hold step HOLD_AT and nothing after it; the lost node's is kept by its peer
    wait_until(lambda: replicated(lost, 1) == HOLD_AT, 60, "rank 1's step held by node 0", interval=0.3)
    human = subprocess.run([sys.executable, "-m", "supervisor", "status", "--pid", str(lost.pid)],
                           capture_output=True, text=True, timeout=30, check=False).stdout  # fmt: skip
    assert f"replication: to node 0 at {256 << 20} B/s; rank 1 step {HOLD_AT} (0 steps" in human, human
    # what node 1 retains of its rank: the steps node 0 verified, HOLD_AT the newest
    assert re.search(rf"retained: rank 1 steps (\d+, )?{HOLD_AT}\b", human), human
    lost.signal(signal.SIGKILL)  # the whole node: its daemon, its rank and its standby
    for spawned in lost.events("rank_spawned"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(spawned["pid"], signal.SIGKILL)
    lost.wait(10)
    replacement = start(*args)
    # torch orders the nodes anew: the replacement may be node 0 now, the survivor node 1
    rejoined = joined(replacement)
    mine, port = rejoined["node_rank"], rejoined["master_port"]
    # the first round after the kill: both ranks restore the step they held, bit for bit
    files = [out / f"restored.p{port}.r{r}.json" for r in (0, 1)]
    wait_until(lambda: all(f.exists() for f in files), 60, "both ranks' restore after the kill")
    first_round = [json.loads(f.read_text()) for f in files]
    assert [(r["step"], r["same"]) for r in first_round] == [(HOLD_AT, True)] * 2, restored(out)
    assert survivor.wait(120) == 0, survivor.story()
    assert replacement.wait(60) == 0, replacement.story()
    # the replacement's rank had nothing in memory: its step came from the survivor
    told = replacement.events("snapshot_restored")
    assert [(e["rank"], e["step"], e["source"]) for e in told] == [(mine, HOLD_AT, "peer")], told
    agreed = replacement.events("snapshots_agreed")
    assert agreed[-1]["step"] == HOLD_AT and agreed[-1]["peers"] == [mine], agreed
