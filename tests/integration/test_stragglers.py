"""Straggler detection with real ranks: a real DDP job on gloo whose ranks time their
steps through the client's hook, and two real nodes sharing their medians through the
rendezvous store. What the daemon decides from the timings (scores, actions, the
ledger, the metric, the report's marker) is in tests/fast/test_stragglers.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import RANKS, Daemon, Timeout, wait_until

Start = Callable[..., Daemon]
# quick to fill and to sustain: a test lasts seconds, not the minutes of the defaults
FAST = ("--straggler-window", "8", "--straggler-warmup", "2", "--straggler-sustain", "0.5")
SECTIONS = ("--ft-rank-section-timeouts", "step:none,checkpointing:none")
NO_TORCH = ("--preload", "none")  # straggling.py steps without torch: nothing to preload


@pytest.mark.torch
def test_a_ddp_rank_computing_longer_is_flagged_and_its_peer_is_not(start: Start, tmp_path: Path) -> None:
    # the ranks step until the test has seen the verdict (the peer scored all along, over the
    # same windows that flagged the straggler); a fixed 40 steps ran ~20 past it, or raced it
    # on a busy machine
    stop = tmp_path / "stop"
    d = start("--nproc-per-node", "2", *FAST, str(RANKS / "ddp_straggling.py"), "--steps", "2000",
              "--step-time", "0.05", "--slow-rank", "1", "--factor", "1.3",
              "--stop-file", str(stop))  # fmt: skip
    try:
        found = d.wait_event("straggler_detected", timeout=60)
        assert found[0]["rank"] == 1, d.story()
    finally:
        stop.touch()
    assert d.wait() == 0, d.story()
    assert {e["rank"] for e in d.events("straggler_detected")} == {1}


@pytest.mark.torch  # the test's rendezvous store
@pytest.mark.slow
def test_with_one_rank_a_node_the_job_s_ranks_are_the_reference(
    start: Start, endpoint: str, tmp_path: Path
) -> None:
    # a node alone has nobody to compare with: the other nodes' medians, shared through
    # the rendezvous store, make the job's typical rank the reference. The ranks step
    # until the test has seen the verdict (the exchange takes a few one-second rounds,
    # more on a busy machine: a fixed number of steps raced it)
    stop = tmp_path / "stop"
    conf = "is_host=0,keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=60"
    program = ("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
               endpoint, "--local-addr", "127.0.0.1", "--rdzv-conf", conf, *FAST, *SECTIONS, *NO_TORCH,
               str(RANKS / "straggling.py"), "--steps", "1200", "--step-time", "0.05", "--slow-rank", "1",
               "--factor", "1.5", "--stop-file", str(stop))  # fmt: skip
    nodes = [start(*program), start(*program)]

    def detected() -> list[dict[str, object]] | None:
        return [e for d in nodes for e in d.events("straggler_detected")] or None

    try:
        wait_until(detected, 60, "a straggler flagged on either node")
    except Timeout as exc:
        raise AssertionError(f"{exc}\n{nodes[0].story()}{nodes[1].story()}") from None
    finally:
        stop.touch()
    assert [d.wait(60) for d in nodes] == [0, 0], nodes[0].story() + nodes[1].story()
    # the exchange worked: the lone slow rank was scored against the other node's (the
    # score itself, exact, in tests/fast/test_stragglers.py)
    found = [e for d in nodes for e in d.events("straggler_detected")]
    assert [(e["rank"], e["against"]) for e in found] == [(1, "job")], found
