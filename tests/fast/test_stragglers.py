"""Straggler detection, driven in-process on virtual time: the ranks' step sections or
their clients' ``timing`` messages (work, wait) in, ``straggler_detected`` and
``--straggler-action`` out. Scores are exact here: the steps take what the script says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli import main
from supervisor.client.timing import StepTimer
from supervisor.coord.job import LocalJob
from supervisor.runtime.lifecycle.daemon import Supervisor
from supervisor.runtime.services.metrics import Metrics
from tests.fast.fakes import Rank
from tests.fast.harness import Watcher, supervise

RESCHEDULE = 200
# quick to fill and to sustain, as the integration tests had them
FAST = ("--straggler-window", "8", "--straggler-warmup", "2", "--straggler-sustain", "0.5")
SECTIONS = ("--ft-rank-section-timeouts", "step:none,checkpointing:none")


def straggling(*, steps: int = 60, step_time: float = 0.05, slow_rank: int | None = None, factor: float = 1.3,
               wait_time: float = 0.0, eval_every: int = 0, eval_time: float = 0.3, save_every: int = 0,
               save_time: float = 0.4, bad_timing: bool = False):  # fmt: skip
    """tests/fixtures/ranks/straggling.py as a script: steps in ``step`` sections; with
    ``wait_time`` each step also waits in a collective (``client.waiting()``), and the
    client's own StepTimer, on the daemon's clock, measures the steps and sends ``timing``."""

    async def script(r: Rank) -> int | None:
        r.hello()
        timer: StepTimer | None = None
        if wait_time:
            timer = StepTimer(lambda work, wait: r.send("timing", work=round(work, 6), wait=round(wait, 6)),
                              clock=r.ranks.clock.monotonic)  # fmt: skip
        if bad_timing and r.rank == 0:  # what a buggy or hostile client might send
            r.send("timing", work="fast", wait=0.0)
            r.send("timing", work=-1.0, wait=0.0)
        step = step_time * (factor if r.rank == slow_rank else 1.0)
        for i in range(1, steps + 1):
            r.send("section", op="open", name="step", iteration=i - 1)
            await r.sleep(step)
            if timer is not None:
                await r.sleep(wait_time)
                timer.waited(wait_time)
                timer.step_end()
            r.send("section", op="close", name="step", iteration=i)
            if eval_every and i % eval_every == 0:
                await r.sleep(eval_time)  # every rank evaluates, outside the step section
            if save_every and i % save_every == 0 and r.rank == 0:
                if timer is not None:
                    timer.tainted = True  # the client: another section ran, not a measure of speed
                r.send("section", op="open", name="checkpointing", iteration=i)
                await r.sleep(save_time)
                r.send("section", op="close", name="checkpointing", iteration=i)
        return 0

    return script


def _scores(daemon: Supervisor) -> dict[str, float]:
    """The ``ft_supervisor_rank_straggler_score`` samples the metrics endpoint would serve."""
    metrics = Metrics(daemon.events, "r", "n", daemon.clock.wall)
    metrics.refresh(daemon.commands.control("status"))
    return {s.labels["rank"]: s.value for family in metrics.registry.collect() for s in family.samples
            if s.name == "ft_supervisor_rank_straggler_score"}  # fmt: skip


def test_a_rank_sleeping_longer_is_flagged_and_its_peer_is_not(tmp_path: Path) -> None:
    scores: list[dict[str, float]] = []

    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("straggler_detected")
        scores.append(_scores(daemon))  # while it runs: the metric, per rank

    run = supervise(tmp_path, straggling(slow_rank=1), *FAST, *SECTIONS, operator=operator)
    assert run.code == 0, run.story()
    (found,) = run.named("straggler_detected")
    assert found["rank"] == 1, run.story()
    assert found["score"] == pytest.approx(1.3, abs=1e-3)
    assert found["window"] == 8 and found["node"] and found["against"] == "node"
    assert found["work"] == pytest.approx(0.065) and found["reference"] == pytest.approx(0.05)
    assert scores == [{"0": 1.0, "1": pytest.approx(1.3, abs=1e-3)}]
    assert run.decisions() == []  # --straggler-action report: the job goes on
    # the run report marks it on rank 1's lane
    page = tmp_path / "report.html"
    assert main(["report", str(run.rundir), "--html", str(page)]) == 0
    assert page.read_text().count('class="fault straggler"') == 1


def test_a_healthy_run_with_evaluation_and_checkpoints_flags_nobody(tmp_path: Path) -> None:
    script = straggling(step_time=0.04, wait_time=0.002, eval_every=20, eval_time=0.3, save_every=15,
                        save_time=0.4, bad_timing=True)  # fmt: skip
    run = supervise(tmp_path, script, *FAST, *SECTIONS)
    assert run.code == 0, run.story()
    assert not run.named("straggler_detected"), run.story()
    # scored all along, from what the clients measured (an evaluation in the step, rank 0's save)
    scoring = run.one("straggler_scoring")
    assert scoring["ranks"] == [0, 1] and scoring["measured"] == [0, 1]
    assert scoring["reference"] == pytest.approx(0.04)
    # rank 0's malformed timings: dropped, told once in one line, the run unharmed
    dropped = [e for e in run.named("message_dropped") if e["reason"] == "bad_timing"]
    assert len(dropped) == 1, run.named("message_dropped")
    assert "work 'fast'" in dropped[0]["detail"]


def test_without_the_clients_timing_the_save_would_flag_the_saving_rank(tmp_path: Path) -> None:
    # the control of the case above: rank 0's saves are in its step timings when the
    # client does not set them aside, and rank 0 is then the straggler
    async def untainted(r: Rank) -> int | None:
        r.hello()
        timer = StepTimer(lambda work, wait: r.send("timing", work=round(work, 6), wait=round(wait, 6)),
                          clock=r.ranks.clock.monotonic)  # fmt: skip
        for i in range(1, 61):
            await r.sleep(0.04)
            if r.rank == 0 and i % 2 == 0:
                await r.sleep(0.04)  # a save every other step, inside the step's period
            timer.step_end()
        return 0

    run = supervise(tmp_path, untainted, *FAST, *SECTIONS)
    assert [e["rank"] for e in run.named("straggler_detected")] == [0], run.story()


def test_straggler_action_restart_restarts_within_the_budget(tmp_path: Path) -> None:
    script = straggling(steps=40, slow_rank=1)
    run = supervise(
        tmp_path, script, "--max-restarts", "1", "--straggler-action", "restart", *FAST, *SECTIONS
    )
    assert run.code == 0, run.story()
    decision = run.one("decision")
    assert (decision["action"], decision["reason"], decision["generation"]) == ("restart", "straggler", 0)
    assert "rank 1" in decision["detail"]
    # the budget spent, generation 1 straggles too: reported, never acted on
    detected = [(e["generation"], e["rank"], e["action"]) for e in run.named("straggler_detected")]
    assert detected == [(0, 1, "restart"), (1, 1, "restart")], run.story()
    assert run.named("run_finished")[0]["restarts_used"] == 1
    # acted on as soon as detected: the window filled, then sustained
    assert decision["t_mono"] == pytest.approx(run.named("straggler_detected")[0]["t_mono"], abs=1e-6)


def test_straggler_action_reschedule_sends_the_node_away_and_marks_its_ledger(tmp_path: Path) -> None:
    state = tmp_path / "node-state"
    run = supervise(tmp_path, straggling(steps=100, slow_rank=1), "--max-restarts", "1",
                    "--straggler-action", "reschedule", *FAST, *SECTIONS,
                    "--node-state-dir", str(state))  # fmt: skip
    assert run.code == RESCHEDULE, run.story()
    decision = run.one("decision")
    assert (decision["action"], decision["reason"]) == ("reschedule", "straggler"), decision
    assert run.one("node_health_marked")["kind"] == "straggler"
    ledger = json.loads((state / "node-health.json").read_text())
    assert [m["kind"] for m in ledger["marks"]] == ["straggler"]
    assert len(run.named("generation_started")) == 1


class OtherNode(LocalJob):
    """One node of two: the other node's rank 1 takes ``median`` seconds a step."""

    def __init__(self, median: float) -> None:
        super().__init__("localhost", None)
        self.median = median
        self.shared: list[dict[str, Any]] = []

    def share(self, **fields: Any) -> None:
        self.shared.append(fields)

    def sample(self) -> list[dict[str, Any]]:
        return [{"stragglers": {"generation": 0, "medians": {"1": self.median}}}]


def test_with_one_rank_a_node_the_job_s_ranks_are_the_reference(tmp_path: Path) -> None:
    # a node alone has nobody to compare with: the other nodes' medians make the job's
    # typical rank the reference (the exchange through the store: the integration test)
    job = OtherNode(0.05)
    run = supervise(tmp_path, straggling(steps=200, slow_rank=0, factor=1.5), "--nproc-per-node", "1",
                    *FAST, *SECTIONS, job=lambda: job)  # fmt: skip
    assert run.code == 0, run.story()
    found = run.named("straggler_detected")
    assert [(e["rank"], e["against"]) for e in found] == [(0, "job")], run.story()
    assert found[0]["score"] == pytest.approx(1.5, abs=1e-3)
    assert found[0]["reference"] == pytest.approx(0.05)
    # and this node's medians went to the job, of its generation
    assert job.shared and job.shared[-1]["stragglers"] == {"generation": 0, "medians": {"0": 0.075}}


def test_a_straggler_that_keeps_pace_again_is_cleared(tmp_path: Path) -> None:
    async def slow_then_not(r: Rank) -> int | None:
        r.hello()
        for i in range(1, 121):  # rank 1 takes 1.5x its peer's step for 40 steps, then keeps pace
            step = 0.05 * (1.5 if r.rank == 1 and i <= 40 else 1.0)
            r.send("section", op="open", name="step", iteration=i - 1)
            await r.sleep(step)
            r.send("section", op="close", name="step", iteration=i)
        return 0

    run = supervise(tmp_path, slow_then_not, *FAST, *SECTIONS)
    assert run.code == 0, run.story()
    detected, cleared = run.one("straggler_detected"), run.one("straggler_cleared")
    assert (detected["rank"], cleared["rank"]) == (1, 1)
    assert cleared["t_mono"] > detected["t_mono"] and cleared["score"] < 1.1
