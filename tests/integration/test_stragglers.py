"""Straggler detection with real ranks: sleeps without communication, and a real
DDP job on gloo whose ranks time their steps through the client's hook."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.cli import main
from tests.support import RANKS, Daemon, Timeout, wait_until

Start = Callable[..., Daemon]
RESCHEDULE = 200  # the reschedule exit code's default
# quick to fill and to sustain: a test lasts seconds, not the minutes of the defaults
FAST = ("--straggler-window", "8", "--straggler-warmup", "2", "--straggler-sustain", "0.5")
SECTIONS = ("--ft-rank-section-timeouts", "step:none,checkpointing:none")
NO_TORCH = ("--preload", "none")  # straggling.py steps without torch: nothing to preload


def _scores(port: int) -> dict[str, float] | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = {s.labels["rank"]: s.value for family in text_string_to_metric_families(text)
             for s in family.samples if s.name == "ft_supervisor_rank_straggler_score"}  # fmt: skip
    return found if len(found) == 2 else None


def test_a_rank_sleeping_longer_is_flagged_and_its_peer_is_not(start: Start, tmp_path: Path) -> None:
    d = start("--nproc-per-node", "2", "--metrics-port", "0", *FAST, *SECTIONS, *NO_TORCH,
              str(RANKS / "straggling.py"), "--steps", "60", "--step-time", "0.05", "--slow-rank", "1",
              "--factor", "1.3")  # fmt: skip
    found = d.wait_event("straggler_detected", timeout=30)
    assert found[0]["rank"] == 1, d.story()
    assert 1.2 <= found[0]["score"] <= 1.45, found
    assert found[0]["window"] == 8 and found[0]["node"] and found[0]["against"] == "node"
    # while it runs: the metric, per rank (refreshed every second)
    port = int(d.wait_event("metrics_serving")[0]["port"])
    scores = wait_until(lambda: _scores(port), 10, "both ranks' straggler scores")
    assert scores["0"] == 1.0 and scores["1"] >= 1.2, scores
    assert d.wait() == 0, d.story()
    assert {e["rank"] for e in d.events("straggler_detected")} == {1}
    assert not d.events("decision")  # --straggler-action report: the job goes on
    # the run report marks it on rank 1's lane
    page = tmp_path / "report.html"
    run_dir = d.run_dir()
    assert run_dir is not None and main(["report", str(run_dir), "--html", str(page)]) == 0
    assert page.read_text().count('class="fault straggler"') == 1


@pytest.mark.torch
def test_a_ddp_rank_computing_longer_is_flagged_and_its_peer_is_not(start: Start) -> None:
    d = start("--nproc-per-node", "2", *FAST, str(RANKS / "ddp_straggling.py"),
              "--steps", "40", "--step-time", "0.05", "--slow-rank", "1", "--factor", "1.3")  # fmt: skip
    found = d.wait_event("straggler_detected", timeout=60)
    assert found[0]["rank"] == 1, d.story()
    assert d.wait() == 0, d.story()
    assert {e["rank"] for e in d.events("straggler_detected")} == {1}


def test_a_healthy_run_with_evaluation_and_checkpoints_flags_nobody(start: Start) -> None:
    d = start("--nproc-per-node", "2", *FAST, *SECTIONS, *NO_TORCH, str(RANKS / "straggling.py"),
              "--steps", "60", "--step-time", "0.04", "--wait-time", "0.002", "--eval-every", "20",
              "--eval-time", "0.3", "--save-every", "15", "--save-time", "0.4", "--bad-timing")  # fmt: skip
    assert d.wait() == 0, d.story()
    assert not d.events("straggler_detected"), d.story()
    # scored all along, from what the clients measured (an evaluation in the step, rank 0's save)
    (scoring,) = d.events("straggler_scoring")
    assert scoring["ranks"] == [0, 1] and scoring["measured"] == [0, 1]
    # rank 0's malformed timings: dropped, told once in one line, the run unharmed
    dropped = [e for e in d.events("message_dropped") if e["reason"] == "bad_timing"]
    assert len(dropped) == 1, d.events("message_dropped")
    assert "work 'fast'" in dropped[0]["detail"]


def test_straggler_action_restart_restarts_within_the_budget(start: Start) -> None:
    d = start("--nproc-per-node", "2", "--max-restarts", "1", "--straggler-action", "restart", *FAST,
              *SECTIONS, *NO_TORCH, str(RANKS / "straggling.py"),
              "--steps", "40", "--step-time", "0.05", "--slow-rank", "1", "--factor", "1.3")  # fmt: skip
    decision = d.wait_event("decision", timeout=30)[0]
    assert decision["action"] == "restart" and decision["reason"] == "straggler", decision
    assert "rank 1" in decision["detail"]
    # the budget spent, generation 1 straggles too: reported, never acted on
    d.wait_event("straggler_detected", where=lambda e: e["generation"] == 1, timeout=30)
    assert d.wait() == 0, d.story()
    assert len(d.events("decision")) == 1


def test_straggler_action_reschedule_sends_the_node_away_and_marks_its_ledger(
    start: Start, tmp_path: Path
) -> None:
    state = tmp_path / "node-state"
    d = start("--nproc-per-node", "2", "--max-restarts", "1", "--straggler-action", "reschedule", *FAST,
              *SECTIONS, *NO_TORCH, "--node-state-dir", str(state), str(RANKS / "straggling.py"),
              "--steps", "100", "--step-time", "0.05", "--slow-rank", "1", "--factor", "1.3")  # fmt: skip
    assert d.wait() == RESCHEDULE, d.story()
    (decision,) = d.events("decision")
    assert decision["action"] == "reschedule" and decision["reason"] == "straggler", decision
    (marked,) = d.events("node_health_marked")
    assert marked["kind"] == "straggler"
    ledger = json.loads((state / "node-health.json").read_text())
    assert [m["kind"] for m in ledger["marks"]] == ["straggler"]


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
    found = [e for d in nodes for e in d.events("straggler_detected")]
    assert [(e["rank"], e["against"]) for e in found] == [(1, "job")], found
    assert 1.3 <= found[0]["score"] <= 1.65
