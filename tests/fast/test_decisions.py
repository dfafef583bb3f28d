"""Decisions on the stories of real training code (issue 11), on virtual time: the right
rank, the right timeout, the right action. The stories are those of
tests/integration/test_decisions.py (Lightning's BoringModel, PyTorch's DDP tutorial,
NVRx through the shim, NCCL's error raised through ``finally``), told by fake ranks with
the lines those ranks print; ``ft-supervisor classify`` must agree with reason.json."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli.classify import classify_run
from tests.fast.fakes import Rank
from tests.fast.harness import Run, supervise

STACKS = Path(__file__).parent.parent / "fixtures" / "stacks"
FAILURES = Path(__file__).parent.parent / "fixtures" / "failures"
# real faulthandler dumps of gloo ranks: rank 1 sleeps in its own code, rank 0 waits in all_reduce
OWN_CODE, IN_ALLREDUCE = ((STACKS / f"allreduce_rank{r}.txt").read_text() for r in (1, 0))
# what gloo's peer prints when the failed rank's process group goes away (the golden corpus)
PEER_RESET = (FAILURES / "d5_gloo_connection_reset.log").read_text()
WATCHDOG = (
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4021, OpType=ALLREDUCE, "
    "NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for 600046 milliseconds before timing out."
)
SECTIONS = ("--ft-rank-section-timeouts", "setup:120,step:3,checkpointing:60")


def decisions(run: Run) -> list[tuple[int, str, str, int | None, str | None]]:
    return [(e["generation"], e["action"], e["reason"], e["rank"], e["rule"]) for e in run.named("decision")]


def reason(run: Run) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((run.rundir / "reason.json").read_text())
    return found


def classify_agrees(run: Run) -> dict[str, Any]:
    """``ft-supervisor classify RUN_DIR --json`` of the run directory the daemon left."""
    found, problems = classify_run(run.rundir)
    assert not problems, problems
    return found


def lightning_boring(r: Rank) -> Any:
    """BoringModel with FaultToleranceCallback, 60 steps of 0.1 s, a checkpoint every 20.
    Generation 0: rank 1 raises at step 25 and takes 5 s to exit, while rank 0 waits in
    the all-reduce of step 25. Generation 1 (from step 20): rank 1 hangs in training_step
    at step 45, after rank 0 opened it and waits in the all-reduce. Generation 2 (from
    step 40) finishes."""

    async def script() -> int | None:
        r.hello(stack_signal=signal.SIGUSR1)
        r.send("section", op="open", name="setup")
        await r.sleep(0.5)
        if r.generation:
            r.send("checkpoint", event="loaded")
        r.send("section", op="close", name="setup")
        for step in range(20 * r.generation, 60):
            if (r.generation, step) == (0, 25):
                if r.rank == 1:
                    r.raise_("RuntimeError", "BoringModel failed at step 25")
                    await r.sleep(5)  # its teardown: the peer's deadline passes meanwhile
                    return 1
                r.send("section", op="open", name="step")
                await r.hang()  # in the all-reduce, for a peer that already failed
            if (r.generation, step) == (1, 45):
                if r.rank == 1:
                    await r.sleep(0.2)  # rank 0 opened the step first
                r.send("section", op="open", name="step")
                r.stacks = OWN_CODE if r.rank == 1 else IN_ALLREDUCE
                await r.hang()
            await r.step(step, 0.1)
            if step % 20 == 19:
                r.send("section", op="open", name="checkpointing")
                await r.sleep(0.3)
                r.send("section", op="close", name="checkpointing")
                r.send("checkpoint", event="saved")
        return 0

    return script()


def test_lightning_boring_model_crash_while_its_peer_waits_is_no_hang_then_a_hang_blames_the_stuck_rank(
    tmp_path: Path,
) -> None:
    run = supervise(tmp_path, lightning_boring, "--max-restarts", "2", *SECTIONS)
    assert run.code == 0, run.story()
    assert decisions(run) == [(0, "restart", "rank_failed", 1, "P9"), (1, "restart", "rank_hung", 1, "HANG")]
    # generation 0: the crash, and no hang: rank 0's deadline fired 3 s into its step, while
    # its peer, which said it failed, was on its way out
    ignored = [e for e in run.named("deadline_ignored") if e["generation"] == 0]
    assert [e["rank"] for e in ignored] == [0]
    assert not [e for e in run.named("deadline_missed") if e["generation"] == 0]
    # the exiting rank was not signalled for its stacks
    assert not [e for e in run.named("stacks_dumped") if e["generation"] == 0]
    assert signal.SIGUSR1 not in run.ranks.of(0)[1].proc.signals
    failed = {e["rank"]: (e["exit_code"], e["signal"]) for e in run.named("rank_exited")
              if e["state"] == "failed" and e["generation"] == 0}  # fmt: skip
    assert failed == {1: (1, None)}  # with its own status, 5 s later
    # generation 1: rank 0's deadline fired first...
    missed = run.named("deadline_missed")
    assert [(e["generation"], e["rank"], e["section"]) for e in missed] == [(1, 0, "step")]
    assert missed[0]["open_for"] == pytest.approx(3.0, abs=1e-3)
    # ...but rank 1, stuck in its own code, is the one declared hung and killed
    hung = run.one("rank_hung")
    assert (hung["generation"], hung["rank"], hung["blamed_by"], hung["deadline_rank"]) == (1, 1, "stacks", 0)
    assert hung["waiting"] == [0]
    assert "rank 1: own (stuck_here" in hung["evidence"], hung["evidence"]
    assert [e["signal"] for e in run.named("rank_exited") if e["rank"] == 1 and e["generation"] == 1] == [
        "SIGKILL"
    ]
    assert reason(run)["last_failure"]["rank"] == 1
    # the hung step and the peers' waits taught nothing: step learned from healthy steps only
    learned = run.named("timeouts_learned")
    assert learned and all(e["learned"]["sections"]["step"] < 3.0 for e in learned), learned
    assert learned[-1]["in_force"]["sections"]["step"] == 3.0  # the configured value stands
    assert "setup" in learned[-1]["learned"]["sections"]  # generations 1 and 2 loaded a checkpoint
    found = classify_agrees(run)
    judged = [(j["generation"], j["rule"], j["rank"]) for j in found["decisions"]]
    assert judged == [(0, "P9", 1), (1, "HANG", 1)]
    assert found["last_failure"]["rank"] == 1


def test_ddp_tutorial_two_kills_an_epoch_apart_restart_twice(tmp_path: Path) -> None:
    """No client, so no progress reports: a second SIGKILL after real training is not
    taken for a repeat, and restarts are spent as torchrun spends them."""

    async def ddp_tutorial(r: Rank) -> int | None:
        kill_at = {0: 20, 1: 70}.get(r.generation)
        first = {0: 0, 1: 15, 2: 60}[r.generation]  # resumed from its last save (every 15 steps)
        for step in range(first, 90, 5):  # 5 steps of 5 ms at a time
            if r.rank == 1 and step == kill_at:
                return -signal.SIGKILL
            await r.sleep(0.025)
            if (step + 5) % 15 == 0:
                r.log(f"rank {r.rank}: saved at step {step + 5}", stream="stdout")
        return 0

    run = supervise(tmp_path, ddp_tutorial, "--max-restarts", "3")
    assert run.code == 0, run.story()
    assert decisions(run) == [
        (0, "restart", "rank_failed", 1, "X-SIGKILL"),
        (1, "restart", "rank_failed", 1, "X-SIGKILL"),
    ]
    assert not run.named("rank_hung")
    assert reason(run)["restarts_used"] == 2


def test_a_heartbeat_timeout_the_user_set_is_never_tightened_by_learning(tmp_path: Path) -> None:
    # issue 11: --ft-rank-heartbeat-timeout 3 with 100 ms steps learned 1 s, which then
    # declared a rank hung while it waited for its failing peer
    async def monitored(r: Rank) -> int | None:
        r.hello()
        for step in range(24):
            await r.sleep(0.1)
            r.heartbeat()
            if (step + 1) % 8 == 0:
                r.send("section", op="open", name="checkpointing")
                await r.sleep(0.1)
                r.send("section", op="close", name="checkpointing")
                r.send("checkpoint", event="saved")
        return 0

    run = supervise(tmp_path, monitored, "--ft-rank-heartbeat-timeout", "3")
    assert run.code == 0, run.story()
    learned = run.one("timeouts_learned")
    assert learned["learned"]["heartbeat"] == pytest.approx(1.0, abs=0.01)  # 5 x the longest gap (0.2 s)
    assert learned["in_force"]["heartbeat"] == 3.0  # the user's value stands


def nccl_raise(slow_exit: float):
    """tests/fixtures/ranks/nccl_raise.py: rank 1 raises NCCL's watchdog timeout at step 5;
    its ``finally`` destroys the process group, and rank 0, in the all-reduce, reads the
    reset and exits 1 at once. slow_exit 0: rank 1 printed its error and exits first;
    slow_exit 3: it printed its error, but takes 3 s over its cleanup, so rank 0 exits
    first, and rank 1 is stopped on its way out."""
    reset = asyncio.Event()

    async def script(r: Rank) -> int | None:
        r.hello()
        if r.generation > 0:
            await r.train(5)
            r.log(f"rank {r.rank} generation {r.generation}: done", stream="stdout")
            return 0
        if r.rank == 0:
            await r.train(5)
            await reset.wait()
            await r.sleep(0.01 if slow_exit else 0.05)  # gloo reads the reset
            r.log(PEER_RESET)
            return 1
        await r.train(5)
        code = r.raise_("RuntimeError", WATCHDOG)
        reset.set()  # finally: dist.destroy_process_group()
        await r.sleep(slow_exit)
        return code

    return script


@pytest.mark.parametrize("slow_exit", [0.0, 3.0], ids=["raiser_exits_first", "peer_exits_first"])
def test_an_nccl_error_raised_through_finally_is_the_cause_not_the_peers_reset(
    tmp_path: Path, slow_exit: float
) -> None:
    run = supervise(tmp_path, nccl_raise(slow_exit), "--max-restarts", "1")
    assert run.code == 0, run.story()
    assert decisions(run) == [(0, "restart", "rank_failed", 1, "N1")], run.story()
    first = min((e for e in run.named("rank_exited") if e["generation"] == 0), key=lambda e: e["t_mono"])
    assert first["rank"] == (1 if slow_exit == 0 else 0)  # the order this case is about
    assert classify_agrees(run)["last_failure"]["rule"] == "N1"


def test_nvrx_heartbeats_null_timeouts_calculated_at_once_find_a_stopped_rank(tmp_path: Path) -> None:
    """NVRx's fault_tol_cfg_heartbeats.yaml (null timeouts): nothing is enforced, and the
    daemon says so, until the script calculates them: at once, at the floor. Then rank 1
    stops beating (rank 0 a step later, in the all-reduce): found 2 s later, blamed by its
    stacks, restarted."""
    config = tmp_path / "ft.yaml"
    config.write_text(
        "fault_tolerance:\n  initial_rank_heartbeat_timeout: null\n  rank_heartbeat_timeout: null\n"
    )

    async def nvrx_heartbeats(r: Rank) -> int | None:
        r.hello(stack_signal=signal.SIGUSR1)
        r.stacks = IN_ALLREDUCE if r.rank == 0 else OWN_CODE
        for step in range(40):
            r.heartbeat()
            await r.sleep(0.1)
            if step == 5:
                r.send("calculate", id=f"c{r.rank}", heartbeat=True)
            if (r.generation, step) == (0, 21 - r.rank):  # rank 0 waits in the next all-reduce
                await r.hang()
        return 0

    run = supervise(tmp_path, nvrx_heartbeats, "--max-restarts", "1", "--ft-cfg-path", str(config),
                    "--ft-learned-timeout-floor", "2")  # fmt: skip
    assert run.code == 0, run.story()
    unmonitored = run.named("heartbeats_unmonitored")
    assert unmonitored and unmonitored[0]["generation"] == 0
    calculated = run.named("timeouts_calculated")[0]
    assert calculated["in_force"]["heartbeat"] == 2.0  # at once, at the floor
    hung = run.one("rank_hung")
    assert (hung["rank"], hung["kind"], hung["blamed_by"]) == (1, "heartbeat", "stacks"), run.story()
    assert hung["open_for"] == pytest.approx(2.0, abs=1e-3)
    assert decisions(run) == [(0, "restart", "rank_hung", 1, "HANG")]
    assert classify_agrees(run)["last_failure"]["rank"] == 1


def test_unchanged_nvrx_code_outside_the_rank_bootstrap_is_a_setup_error_that_spends_no_restart(
    tmp_path: Path,
) -> None:
    """NVRx's own client, loaded where the bootstrap does not serve ours (--no-python),
    fails for want of ft_launcher's socket: a setup error, no restart spent."""

    async def nvrx_unchanged(r: Rank) -> int | None:
        return r.raise_("nvidia_resiliency_ext.fault_tolerance.rank_monitor_client.RankMonitorClientError",
                        "FT_RANK_MONITOR_IPC_SOCKET env variable should be set")  # fmt: skip

    run = supervise(tmp_path, nvrx_unchanged, "--max-restarts", "3")
    assert run.code == 2, run.story()
    decision = run.one("decision")
    assert (decision["action"], decision["rule"], decision["restarts_used"]) == ("abort", "P0-NVRX", 0)
    assert "--no-python" in decision["detail"]
    assert "import supervisor.client.nvrx as fault_tolerance" in decision["detail"]
    assert len(run.named("generation_started")) == 1
    assert classify_agrees(run)["classification"]["rule"] == "P0-NVRX"


def test_what_a_killed_ranks_forked_helper_says_after_its_death_decides_nothing(tmp_path: Path) -> None:
    """Rank 1 is SIGKILLed; its forked helper, which inherited the client's excepthook,
    dies of "Connection reset by peer" into the rank's log and reports it under its own
    pid: the rank's own SIGKILL decides."""

    async def orphan_speaks(r: Rank) -> int | None:
        r.hello()
        await r.train(3)
        if r.generation == 0 and r.rank == 1:
            helper = r.pid + 1000

            def speaks() -> None:
                reset = "[Errno 104] Connection reset by peer"
                r.log(f"ConnectionResetError: {reset}")
                r.send("exception", exc_type="ConnectionResetError", message=reset, traceback="", causes=[],
                       pid=helper)  # fmt: skip

            speaks()  # as it dies: the generation has not ended yet
            return -signal.SIGKILL
        await r.train(3, first=3)
        return 0

    run = supervise(tmp_path, orphan_speaks, "--max-restarts", "1")
    assert run.code == 0, run.story()
    assert decisions(run) == [(0, "restart", "rank_failed", 1, "X-SIGKILL")]
    assert not run.named("exception_reported")
    assert [e["exc_type"] for e in run.named("child_exception")] == ["ConnectionResetError"]
    assert classify_agrees(run)["last_failure"]["rule"] == "X-SIGKILL"


@pytest.mark.parametrize(("asked", "action"), [("exclude_node", "reschedule"), ("shutdown", "continue")])
def test_nvrx_workload_control_requests_reach_the_daemon(tmp_path: Path, asked: str, action: str) -> None:
    """tests/fixtures/ranks/nvrx_style.py: rank 1 fails at iteration 3 and, as NVRx's
    client is asked to, sends a workload control request before its exception ends it:
    the request decides, and nothing is restarted."""

    async def nvrx_style(r: Rank) -> int | None:
        r.hello()
        for step in range(10):
            if (r.rank, step) == (1, 3):
                error = f"rank {r.rank}: uncorrectable ECC error (simulated)"
                r.send("request", action=asked, reason=error)
                r.send("bye")  # shutdown_workload_monitoring()
                return r.raise_("RuntimeError", error)
            await r.step(step, 0.1)
        return 0

    run = supervise(tmp_path, nvrx_style, "--max-restarts", "1", "--ft-rank-section-timeouts",
                    "init:10,step:10,checkpoint:10")  # fmt: skip
    requests = run.named("workload_request")
    assert [(e["rank"], e["action"]) for e in requests] == [(1, asked)], run.story()
    assert "uncorrectable ECC error" in requests[0]["reason"]
    assert run.decisions() == [(action, "workload_request")]
    assert [e["generation"] for e in run.named("generation_started")] == [0]  # no restart


@pytest.mark.parametrize("kind", ["rank_hung", "sleep", "exception", "rank_killed"])
def test_simulated_faults_are_detected_and_recovered(tmp_path: Path, kind: str) -> None:
    """FT_SIM_FAULT_DESC's faults (supervisor.client.faults) as the daemon sees them, on
    rank 1 0.3 s into generation 0: silence (rank_hung; sleep, in the fault's handler),
    an exception, a SIGKILL. (The handler in a real rank's stacks:
    tests/integration/test_client_adapters.py.)"""

    async def faulty(r: Rank) -> int | None:
        r.hello(stack_signal=signal.SIGUSR1)
        r.stacks = OWN_CODE
        for step in range(30):
            if (r.generation, r.rank, step) == (0, 1, 3):
                r.log(f"FT: simulating fault: {kind} on rank 1")
                if kind in ("rank_hung", "sleep"):
                    await r.hang()
                if kind == "rank_killed":
                    return -signal.SIGKILL
                return r.raise_("SimulatedFaultError", "simulated fault: exception on rank 1")
            r.heartbeat()
            await r.sleep(0.1)
        return 0

    run = supervise(tmp_path, faulty, "--max-restarts", "1", "--ft-rank-heartbeat-timeout", "0.5",
                    "--ft-rank-section-timeouts", "step:5")  # fmt: skip
    assert run.code == 0, run.story()
    if kind in ("rank_hung", "sleep"):
        hung = run.one("rank_hung")
        assert (hung["generation"], hung["rank"], hung["kind"], hung["section"]) == (0, 1, "heartbeat", None)
        dumped = next(e for e in run.named("stacks_dumped") if e["rank"] == 1)
        assert dumped["generation"] == 0 and "stuck_here" in dumped["stacks"]
        assert run.decisions() == [("restart", "rank_hung")]
    else:
        failed = [e for e in run.named("rank_exited") if e["state"] == "failed"]
        assert [e["rank"] for e in failed] == [1]
        assert (failed[0]["exit_code"], failed[0]["signal"]) == ((None, "SIGKILL") if kind == "rank_killed"
                                                                 else (1, None))  # fmt: skip
        assert not run.named("rank_hung")
        assert run.decisions() == [("restart", "rank_failed")]
    done = {e["rank"] for e in run.named("rank_exited") if e["generation"] == 1 and e["exit_code"] == 0}
    assert done == {0, 1}
