"""The loop of generations, driven in-process on virtual time: launch, await the end,
decide, apply. Each case is a real daemon beside fake ranks (tests/fast/fakes.py)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from supervisor.runtime.lifecycle import signals
from supervisor.runtime.lifecycle.daemon import Supervisor
from tests.fast.fakes import Behaviour, Rank
from tests.fast.harness import Watcher, supervise

CUDA = ("RuntimeError", "CUDA error: an illegal memory access was encountered")
STACKS = Path(__file__).parent.parent / "fixtures" / "stacks"
# real faulthandler dumps of gloo ranks: rank 1 sleeps in its own code, rank 0 waits in all_reduce
OWN_CODE, IN_ALLREDUCE = ((STACKS / f"allreduce_rank{r}.txt").read_text() for r in (1, 0))


async def steady(r: Rank) -> int | None:
    r.hello()
    await r.train(5)
    return 0


def crash_in(generation: int, rank: int, after: int = 3):
    async def script(r: Rank) -> int | None:
        r.hello()
        await r.train(after)
        if r.generation == generation and r.rank == rank:
            return r.raise_(*CUDA)
        await r.train(2, first=after)
        return 0

    return script


async def crash_always(r: Rank) -> int | None:
    """Fails every generation, each time a little further (a checkpoint each step)."""
    r.hello()
    await r.train(3, first=10 * r.generation)
    return r.raise_(*CUDA) if r.rank == 0 else await r.hang()


def reason_of(run) -> dict:
    return json.loads((run.rundir / "reason.json").read_text())


def test_a_run_that_simply_succeeds_decides_nothing(tmp_path: Path) -> None:
    run = supervise(tmp_path, steady)
    assert run.code == 0, run.story()
    assert run.decisions() == []
    assert reason_of(run)["outcome"] == "succeeded"
    assert run.one("generation_ended")["result"] == "succeeded"


def test_a_crash_restarts_the_generation_and_the_run_succeeds(tmp_path: Path) -> None:
    run = supervise(tmp_path, crash_in(0, 1), "--max-restarts", "3")
    assert run.code == 0, run.story()
    assert run.decisions() == [("restart", "rank_failed")], run.story()
    decision = run.one("decision")
    assert (decision["rule"], decision["rank"], decision["restarts_used"]) == ("C2", 1, 0)
    assert run.named("run_finished")[0]["restarts_used"] == 1
    assert reason_of(run)["last_failure"]["rule"] == "C2"


def test_a_crash_after_ten_minutes_is_decided_as_one_in_the_first_second(tmp_path: Path) -> None:
    def crash_after(seconds: float):
        async def script(r: Rank) -> int | None:
            r.hello()
            await r.sleep(seconds)
            if r.generation == 0 and r.rank == 0:
                return r.raise_(*CUDA)
            await r.train(2)
            return 0

        return script

    early = supervise(tmp_path / "early", crash_after(0.5), "--max-restarts", "1")
    late = supervise(tmp_path / "late", crash_after(600), "--max-restarts", "1")
    assert early.decisions() == late.decisions() == [("restart", "rank_failed")]
    assert late.one("decision")["t_mono"] - late.named("generation_started")[0]["t_mono"] >= 600


def test_restarts_run_out_and_the_run_ends_on_its_failure(tmp_path: Path) -> None:
    run = supervise(tmp_path, crash_always, "--max-restarts", "2")
    actions = [a for a, _ in run.decisions()]
    assert actions[:2] == ["restart", "restart"], run.story()
    assert actions[-1] != "restart"
    assert run.code != 0
    assert reason_of(run)["restarts_used"] == 2
    assert len({e["generation"] for e in run.named("generation_started")}) == 3


def test_no_restarts_allowed_ends_the_run_on_the_first_failure(tmp_path: Path) -> None:
    run = supervise(tmp_path, crash_in(0, 0), "--max-restarts", "0")
    assert len(run.named("generation_started")) == 1
    assert run.code != 0
    assert run.one("decision")["action"] != "restart"


def test_a_rank_killed_by_a_signal_is_the_failure_and_its_peer_is_stopped(tmp_path: Path) -> None:
    async def killed(r: Rank) -> int | None:
        r.hello()
        await r.train(2)
        if r.generation == 0 and r.rank == 1:
            return -signal.SIGKILL
        await r.train(2, first=2)
        return 0

    run = supervise(tmp_path, killed, "--max-restarts", "1")
    assert run.code == 0, run.story()
    decision = run.one("decision")
    assert (decision["action"], decision["rank"]) == ("restart", 1), run.story()
    exits = {e["rank"]: e for e in run.named("rank_exited") if e["generation"] == 0}
    assert exits[1]["signal"] == "SIGKILL" and exits[0]["signal"] == "SIGTERM"


def test_a_rank_stuck_in_its_step_is_hung_and_restarted(tmp_path: Path) -> None:
    async def stuck(r: Rank) -> int | None:
        r.hello(stack_signal=signal.SIGUSR1)
        await r.train(6)  # past the warm-up steps, which no step timeout holds
        if r.generation == 0:  # rank 1 stuck in its step, rank 0 waiting in a collective for it
            if r.rank == 1:
                r.send("section", op="open", name="step")
            r.stacks = OWN_CODE if r.rank == 1 else IN_ALLREDUCE
            await r.hang()
        await r.train(2, first=6)
        return 0

    run = supervise(tmp_path, stuck, "--max-restarts", "1", "--ft-rank-section-timeouts", "step:30")
    assert run.code == 0, run.story()
    missed = run.one("deadline_missed")
    assert (missed["rank"], missed["section"]) == (1, "step")
    hung = run.one("rank_hung")
    assert (hung["rank"], hung["blamed_by"], hung["waiting"]) == (1, "stacks", [0]), run.story()
    assert len(run.named("stacks_dumped")) == 2
    assert run.one("decision")["action"] == "restart"
    # noticed within the deadline's bound, on the daemon's clock
    assert 30 <= missed["open_for"] < 31


def test_a_rank_that_stops_its_heartbeats_is_hung(tmp_path: Path) -> None:
    async def beats(r: Rank) -> int | None:
        r.hello()
        for _ in range(5):
            r.heartbeat()
            await r.sleep(1)
        if r.generation == 0 and r.rank == 0:
            await r.hang()
        return 0

    run = supervise(tmp_path, beats, "--max-restarts", "1", "--ft-rank-heartbeat-timeout", "10")
    assert run.code == 0, run.story()
    missed = run.one("deadline_missed")
    assert (missed["rank"], missed["kind"]) == (0, "heartbeat")


def test_an_operator_restart_costs_no_restart_of_the_budget(tmp_path: Path) -> None:
    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("rank_stepping", generation=0)
        daemon.commands.control("restart")

    async def long(r: Rank) -> int | None:
        r.hello()
        await r.train(10 if r.generation == 0 else 2)
        return 0

    run = supervise(tmp_path, long, "--max-restarts", "1", operator=operator)
    assert run.code == 0, run.story()
    assert run.decisions() == [("restart", "operator_request")]
    assert run.named("run_finished")[0]["restarts_used"] == 0


def test_a_stop_signal_stops_the_ranks_and_exits_128_plus_the_signal(tmp_path: Path) -> None:
    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("rank_stepping", generation=0)
        daemon.commands.queue.put_nowait(signals.Stop(signal.SIGTERM))

    async def forever(r: Rank) -> int | None:
        r.hello()
        await r.train(10_000)
        return 0

    run = supervise(tmp_path, forever, operator=operator)
    assert run.code == 128 + signal.SIGTERM
    assert run.decisions() == []
    assert reason_of(run)["outcome"] == "stopped"
    assert {e["signal"] for e in run.named("rank_exited") if e["generation"] == 0} == {"SIGTERM"}


def test_a_stop_before_any_rank_started_leaves_no_rank_behind(tmp_path: Path) -> None:
    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("run_started")
        daemon.commands.queue.put_nowait(signals.Stop(signal.SIGINT))

    run = supervise(tmp_path, steady, operator=operator)
    assert run.code == 128 + signal.SIGINT
    started = {r.pid for r in run.ranks.spawned}
    ended = {r.pid for r in run.ranks.spawned if r.proc.returncode is not None}
    assert started == ended


def test_a_standby_not_ready_yet_is_hurried_into_the_next_generation(tmp_path: Path) -> None:
    # generation 1's standbys preload for 600 s: the crash at 3 s comes long before
    slow = lambda generation, rank: Behaviour(preload=600.0 if generation == 1 else 0.0)  # noqa: E731
    run = supervise(tmp_path, crash_in(0, 0), "--max-restarts", "1", behaviour=slow)
    assert run.code == 0, run.story()
    started = run.named("generation_started")[1]
    assert (started["standby_ranks"], started["standby_ready"]) == (2, 0)


def test_ready_standbys_take_over_at_the_cost_of_a_go(tmp_path: Path) -> None:
    run = supervise(tmp_path, crash_in(0, 0), "--max-restarts", "1")
    started = run.named("generation_started")[1]
    assert (started["standby_ranks"], started["standby_ready"]) == (2, 2)
    # no rank of generation 1 was spawned after the failure: they were there already
    failed_at = run.one("decision")["t_mono"]
    assert all(e["t_mono"] < failed_at for e in run.named("rank_spawned") if e["generation"] == 1)


def test_without_standbys_the_next_generation_is_spawned_after_the_failure(tmp_path: Path) -> None:
    run = supervise(tmp_path, crash_in(0, 0), "--max-restarts", "1", "--no-standby")
    assert run.code == 0
    failed_at = run.one("decision")["t_mono"]
    assert all(e["t_mono"] >= failed_at for e in run.named("rank_spawned") if e["generation"] == 1)
    assert run.named("generation_started")[1]["standby_ranks"] == 0


def test_a_workload_request_to_reschedule_is_obeyed(tmp_path: Path) -> None:
    async def asks(r: Rank) -> int | None:
        r.hello()
        await r.train(2)
        if r.rank == 0:
            r.send("request", action="reschedule", reason="ECC errors on my GPU")
            return 1
        await r.hang()
        return None

    run = supervise(tmp_path, asks, "--max-restarts", "3")
    assert run.one("decision")["action"] == "reschedule", run.story()
    assert run.code == 200
    assert len(run.named("generation_started")) == 1


def test_a_reported_exception_is_the_evidence_even_with_nothing_in_the_log(tmp_path: Path) -> None:
    async def reports(r: Rank) -> int | None:
        r.hello()
        await r.train(2)
        if r.generation == 0 and r.rank == 1:
            oom = "CUDA out of memory. Tried to allocate 2.00 GiB"
            r.send("exception", exc_type="torch.OutOfMemoryError", message=oom, traceback="Traceback ...",
                   causes=[], pid=r.pid)  # fmt: skip
            return 1
        await r.train(1, first=2)
        return 0

    run = supervise(tmp_path, reports, "--max-restarts", "1")
    decision = run.one("decision")
    assert decision["rank"] == 1, run.story()
    assert decision["category"] == "oom", run.story()


def test_a_rank_that_reports_its_failure_but_never_exits_ends_the_generation(tmp_path: Path) -> None:
    async def lingers(r: Rank) -> int | None:
        r.hello()
        await r.train(2)
        if r.generation == 0 and r.rank == 0:
            r.raise_(*CUDA)  # its error file is written, then its teardown blocks on a peer
            await r.hang()
        if r.generation == 0:
            await r.hang()  # waiting in a collective for the failed rank
        return 0

    stuck = lambda generation, rank: Behaviour(ignores_term=generation == 0)  # noqa: E731
    run = supervise(tmp_path, lingers, "--max-restarts", "1", "--exit-grace", "5", behaviour=stuck)
    assert run.code == 0, run.story()
    assert run.one("rank_exit_stuck")["rank"] == 0
    assert run.one("decision")["rank"] == 0
    # the stuck rank got SIGKILL at once; its peer ignored SIGTERM and got it after the grace
    assert run.named("generation_ended")[0]["killed"] == 1
    first = {r.rank: r.proc.signals for r in run.ranks.of(0)}
    assert first[0][-1] == signal.SIGKILL and signal.SIGTERM not in first[0]


def test_a_rank_that_survives_sigkill_sends_the_node_away(tmp_path: Path) -> None:
    async def stuck(r: Rank) -> int | None:
        r.hello()
        await r.train(1)
        if r.rank == 0:
            return r.raise_(*CUDA)
        await r.hang()
        return None

    unkillable = lambda generation, rank: Behaviour(unkillable=rank == 1)  # noqa: E731
    run = supervise(tmp_path, stuck, "--max-restarts", "3", behaviour=unkillable)
    assert run.one("rank_unkillable")["local_ranks"] == [1]
    assert run.one("decision")["action"] == "reschedule", run.story()
    assert run.code == 200


def test_learned_timeouts_outlive_the_run(tmp_path: Path) -> None:
    async def learns(r: Rank) -> int | None:
        r.hello()
        await r.train(20, seconds=2.0)  # 16 timed steps at least, past the warm-up
        return 0

    options = ("--ft-rank-section-timeouts", "step:30", "--ft-num-warmup-iterations", "2")
    run = supervise(tmp_path, learns, *options)
    assert run.code == 0, run.story()
    learned = run.one("timeouts_learned")["learned"]["sections"]["step"]
    assert 2.0 <= learned < 30
    saved = json.loads((tmp_path / "state" / "timeouts.json").read_text())
    assert saved["learned"]["sections"]["step"] == learned
