"""Hang detection on virtual time: heartbeats, sections and the out-of-section time
with their deadlines exact, the warm-up's exemption, and learned timeouts (taught by a
clean run, kept across an operator's restart and by the next run); what a hang leaves
(its bundle, the Flight Recorder's settings, the metrics' detection and recovery)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from supervisor.core.topology import ENV_TIMEOUTS
from supervisor.process import native
from supervisor.runtime.lifecycle import bundle
from supervisor.runtime.lifecycle.daemon import Supervisor
from supervisor.runtime.services.metrics import Metrics
from tests.fast.fakes import Rank
from tests.fast.harness import Watcher, supervise

STACKS = Path(__file__).parent.parent / "fixtures" / "stacks"
OWN_CODE = (STACKS / "allreduce_rank1.txt").read_text()


@dataclass(frozen=True)
class Monitored:
    """tests/fixtures/ranks/monitored.py: a loop of steps that uses the client, and can hang."""

    steps: int = 20
    step_time: float = 0.01
    heartbeat: bool = False
    section: str | None = None
    iterations: bool = False
    slow_steps: int = 0
    slow_time: float = 0.0
    checkpoint_every: int = 0
    hang_at: int | None = None
    hang_rank: int = 1
    hang_how: str = "sleep"  # in the step (in its section), or "outside" any section
    bye: bool = False

    async def __call__(self, r: Rank) -> int | None:
        r.hello(stack_signal=signal.SIGUSR1)
        r.stacks = OWN_CODE  # faulthandler answers the stack signal wherever the rank is
        hangs = self.hang_at is not None and r.rank == self.hang_rank and r.generation == 0
        for step in range(self.steps):
            if hangs and step == self.hang_at:
                if self.hang_how == "sleep" and self.section:
                    r.send("section", op="open", name=self.section)
                await r.hang()
            if self.section:
                r.send("section", op="open", name=self.section)
            await r.sleep(self.slow_time if step < self.slow_steps else self.step_time)
            if self.section:
                r.send("section", op="close", name=self.section)
            if self.heartbeat:
                r.heartbeat()
            if self.iterations:
                r.send("iteration", iteration=step)
            if self.checkpoint_every and (step + 1) % self.checkpoint_every == 0:
                r.send("section", op="open", name="checkpointing")
                await r.sleep(self.step_time)
                r.send("section", op="close", name="checkpointing")
                r.send("checkpoint", event="saved")
        if self.bye:
            r.send("bye")
        return 0


def test_a_rank_that_stops_heartbeating_is_found_at_its_deadline_dumped_killed_and_restarted(
    tmp_path: Path,
) -> None:
    script = Monitored(heartbeat=True, hang_at=5, step_time=0.01)
    run = supervise(tmp_path, script, "--max-restarts", "1", "--ft-rank-heartbeat-timeout", "0.5")
    assert run.code == 0, run.story()
    hung = run.one("rank_hung")
    assert (hung["rank"], hung["kind"], hung["timeout"]) == (1, "heartbeat", 0.5)
    started = run.named("generation_started")[0]["t_mono"]
    # a timer, at the deadline: on the daemon's clock, to the microsecond
    assert hung["open_for"] == pytest.approx(0.5, abs=1e-3) and hung["late_by"] == pytest.approx(0, abs=1e-3)
    last_beat = 5 * 0.01
    assert hung["t_mono"] - started >= last_beat + 0.5
    dumped = {e["rank"]: e for e in run.named("stacks_dumped")}
    assert dumped[1]["where"] == "own" and "stuck_here" in dumped[1]["stacks"]
    assert "stuck_here" in (run.rundir / "gen_0" / "local_rank_1" / "stderr.log").read_text()
    assert run.decisions() == [("restart", "rank_hung")]
    killed = next(e for e in run.named("rank_exited") if e["generation"] == 0 and e["rank"] == 1)
    assert killed["signal"] == "SIGKILL"  # rank_termination_signal, no grace for a hung rank
    assert signal.SIGTERM not in run.ranks.of(0)[1].proc.signals
    finished = {e["rank"] for e in run.named("rank_exited") if e["generation"] == 1 and e["exit_code"] == 0}
    assert finished == {0, 1}


def test_a_section_open_too_long(tmp_path: Path) -> None:
    options = ("--max-restarts", "1", "--ft-rank-section-timeouts", "step:0.5",
               "--ft-num-warmup-iterations", "0")  # fmt: skip
    run = supervise(tmp_path, Monitored(section="step", hang_at=3), *options)
    assert run.code == 0, run.story()
    hung = run.one("rank_hung")
    assert (hung["kind"], hung["section"], hung["rank"]) == ("section", "step", 1)
    assert hung["open_for"] == pytest.approx(0.5, abs=1e-3)
    assert run.decisions() == [("restart", "rank_hung")]


def test_warmup_iterations_do_not_trip_the_step_timeout(tmp_path: Path) -> None:
    slow = Monitored(section="step", slow_steps=3, slow_time=0.6, steps=8)
    ok = supervise(tmp_path / "ok", slow, "--ft-rank-section-timeouts", "step:0.3",
                   "--ft-num-warmup-iterations", "3")  # fmt: skip
    assert ok.code == 0, ok.story()
    assert not ok.named("rank_hung") and not ok.named("deadline_missed")
    # the same run without warm-up iterations is hung: the check above can fail
    tripped = supervise(tmp_path / "tripped", slow, "--ft-rank-section-timeouts", "step:0.3",
                        "--ft-num-warmup-iterations", "0")  # fmt: skip
    assert tripped.code == 200, tripped.story()  # a hang is transient: with no restart left, run elsewhere
    hung = tripped.named("rank_hung")[0]
    assert hung["section"] == "step" and hung["open_for"] == pytest.approx(0.3, abs=1e-3)
    # in the first step, 0.3 s after it opened (not a step later), and declared once the stacks are in
    started = tripped.one("generation_started")["t_mono"]
    assert tripped.named("deadline_missed")[0]["t_mono"] - started == pytest.approx(0.3, abs=1e-3)
    assert hung["t_mono"] - started < 0.6


def test_out_of_section_timeout_for_a_workload_without_sections(tmp_path: Path) -> None:
    script = Monitored(iterations=True, hang_at=4, hang_how="outside")
    run = supervise(tmp_path, script, "--max-restarts", "1", "--ft-rank-out-of-section-timeout", "0.5")
    assert run.code == 0, run.story()
    hung = run.one("rank_hung")
    assert (hung["kind"], hung["rank"]) == ("out_of_section", 1)
    assert hung["open_for"] == pytest.approx(0.5, abs=1e-3)


def test_a_clean_run_that_says_bye_still_teaches_timeouts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    script = Monitored(section="step", steps=24, checkpoint_every=8, bye=True)
    run = supervise(tmp_path, script, "--state-dir", str(state), "--ft-rank-section-timeouts",
                    "step:none,checkpointing:none", "--ft-num-warmup-iterations", "2")  # fmt: skip
    assert run.code == 0, run.story()
    learned = run.one("timeouts_learned")["learned"]["sections"]
    assert set(learned) == {"step", "checkpointing"}
    assert json.loads((state / "timeouts.json").read_text())["learned"]["sections"] == learned


def test_learned_timeouts_persist_across_a_restart_and_a_new_run(tmp_path: Path) -> None:
    learning = ("--ft-rank-section-timeouts", "step:30,checkpointing:30", "--ft-num-warmup-iterations", "2")
    state = ("--state-dir", str(tmp_path / "state"))
    # generation 0 hangs outside sections at step 22, with no out-of-section timeout
    # set... so the operator ends it once it has learned: a restart
    first_gen = Monitored(section="step", steps=24, checkpoint_every=8, step_time=0.1, hang_at=22,
                          hang_rank=1, hang_how="outside")  # fmt: skip

    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("rank_exited", generation=0, rank=0)  # done; rank 1 hangs
        daemon.commands.control("restart")

    first = supervise(tmp_path / "first", first_gen, "--max-restarts", "1", *state, *learning,
                      operator=operator)  # fmt: skip
    assert first.code == 0, first.story()
    assert first.decisions() == [("restart", "operator_request")]
    learned = first.one("timeouts_learned")["learned"]
    assert 0 < learned["sections"]["step"] < 30
    assert 0 < learned["sections"]["checkpointing"] < 30
    # generation 1 was told the learned values
    told = [orjson.loads(r.env[ENV_TIMEOUTS]) for r in first.ranks.of(1)]
    assert told and all(t["learned"]["sections"]["step"] == learned["sections"]["step"] for t in told), told
    saved = json.loads((tmp_path / "state" / "timeouts.json").read_text())
    assert saved["learned"]["sections"]["step"] == learned["sections"]["step"]
    # a new run starts from them
    second = supervise(tmp_path / "second", Monitored(steps=1), *state, *learning)
    assert second.code == 0
    started = second.one("run_started")["timeouts"]
    assert started["learned"]["sections"]["step"] == saved["learned"]["sections"]["step"]
    # the configured 30 s stands: learning only raises a timeout the user set
    assert started["sections"]["step"] == 30.0
    # with `none` ("learn it") the learned value is in force, above the floor
    relearn = ("--ft-rank-section-timeouts", "step:none,checkpointing:30",
               "--ft-learned-timeout-floor", "0.01")  # fmt: skip
    third = supervise(tmp_path / "third", Monitored(steps=1), *state, *relearn)
    assert third.code == 0
    started = third.one("run_started")["timeouts"]
    assert started["sections"]["step"] == saved["learned"]["sections"]["step"]


# -- what a hang leaves: the bundle, the metrics ---------------------------------------------


def test_a_bundle_that_cannot_be_written_does_not_hold_the_restart(tmp_path: Path) -> None:
    """Where the bundle goes cannot take it (a file in the way): reported, and the job
    restarts all the same."""

    async def in_the_way(r: Rank) -> int | None:
        if r.generation == 0 and r.rank == 0:
            (r.files.dir.parent / "hang-bundle").write_text("in the way")
        return await Monitored(heartbeat=True, steps=30, step_time=0.05, hang_at=20)(r)

    options = ("--no-standby", "--max-restarts", "1", "--ft-rank-heartbeat-timeout", "0.5")
    run = supervise(tmp_path, in_the_way, *options)
    assert run.code == 0, run.story()
    unwritable = run.one("hang_bundle_unwritable")
    assert unwritable["generation"] == 0 and unwritable["error"], unwritable
    assert run.named("hang_bundle") == []
    assert run.decisions() == [("restart", "rank_hung")]
    # held up by nothing: not the bundle's bound (seconds); the dumps' request runs in a thread,
    # and while it does the virtual clock may pass a rank's next step (0.05 s)
    assert run.one("decision")["t_mono"] - run.one("rank_hung")["t_mono"] < 0.5


@pytest.mark.parametrize(
    ("dump_env", "buffer_env", "daemons"),
    [
        (native.DUMP_ENV, native.BUFFER_ENV, native.NEW_DUMP_ENV),
        # torch >= 2.8's names, read before the old ones: the bundle must look there too
        (native.NEW_DUMP_ENV, native.NEW_BUFFER_ENV, native.DUMP_ENV),
    ],
)
def test_the_users_own_flight_recorder_settings_stand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dump_env: str, buffer_env: str, daemons: str
) -> None:
    """The ranks get the user's dump file and buffer, and the daemon's pipe; the bundle
    asks each rank's watchdog for its dump where the user said. (torch's side of the
    pipe: tests/integration/test_bundle.py.)"""
    monkeypatch.setenv(dump_env, str(tmp_path / "mine_"))
    monkeypatch.setenv(buffer_env, "77")
    asked: dict[int, tuple[str | None, str | None]] = {}

    async def flight_recorder(
        env: Mapping[str, str], rank: int, timeout: float, alive: Callable[[], bool]
    ) -> tuple[None, str]:
        asked[rank] = (env.get(native.PIPE_ENV), env.get(native.NEW_DUMP_ENV) or env.get(native.DUMP_ENV))
        return None, "no Flight Recorder here"

    monkeypatch.setattr(bundle, "flight_recorder", flight_recorder)
    monkeypatch.setattr(bundle, "py_spy", lambda: None)  # no native stacks of a fake pid
    monkeypatch.setattr(native, "py_spy", lambda: None)
    script = Monitored(heartbeat=True, steps=300, step_time=0.05, hang_at=20)  # rank 0 lives on
    run = supervise(tmp_path, script, "--no-standby", "--max-restarts", "1",
                    "--ft-rank-heartbeat-timeout", "0.5", "--ft-bundle-timeout", "5")  # fmt: skip
    assert run.code == 0, run.story()
    for r in run.ranks.of(0):
        assert (r.env[dump_env], r.env[buffer_env]) == (str(tmp_path / "mine_"), "77")
        assert daemons not in r.env  # not the other name of the same setting
        assert r.env[native.PIPE_ENV] == str(r.files.dir.parent / "nccl_pipe_rank_")
    gen0 = run.ranks.of(0)[0].files.dir.parent
    assert asked == {r: (str(gen0 / "nccl_pipe_rank_"), str(tmp_path / "mine_")) for r in (0, 1)}
    manifest = json.loads((Path(run.one("hang_bundle")["path"]) / "bundle.json").read_text())
    assert {e["flight_recorder_error"] for e in manifest["ranks"]} == {"no Flight Recorder here"}


def observed(into: list[Metrics]):
    """An operator that feeds the daemon's events to a Prometheus registry (not served)."""

    async def act(daemon: Supervisor, seen: Watcher) -> None:
        metrics = Metrics(daemon.events, "t", "node", daemon.clock.wall)
        daemon.events.listeners.append(metrics.on_event)
        into.append(metrics)

    return act


def test_a_hang_is_observed_with_its_detection_delay(tmp_path: Path) -> None:
    got: list[Metrics] = []
    script = Monitored(heartbeat=True, iterations=True, hang_at=5, steps=300)
    run = supervise(tmp_path, script, "--max-restarts", "1", "--ft-rank-heartbeat-timeout", "0.5",
                    operator=observed(got))  # fmt: skip
    assert run.code == 0, run.story()
    (metrics,) = got
    value = metrics.registry.get_sample_value
    hung = run.one("rank_hung")
    labels = {"run_id": "t", "node": "node"}
    assert value("ft_supervisor_detection_seconds_count", {**labels, "kind": "heartbeat"}) == 1
    assert value("ft_supervisor_detection_seconds_sum", {**labels, "kind": "heartbeat"}) == hung["late_by"]
    decided = {**labels, "action": "restart", "reason": "rank_hung"}
    assert value("ft_supervisor_decisions_total", decided) == 1


def test_a_crash_is_observed_with_its_recovery_time(tmp_path: Path) -> None:
    """The crash noticed -> every rank of the next generation stepping, to the event."""
    got: list[Metrics] = []

    async def crash(r: Rank) -> int | None:
        r.hello()
        await r.train(3)
        if (r.generation, r.rank) == (0, 1):
            return -signal.SIGKILL
        await r.train(3, first=3)
        return 0

    run = supervise(tmp_path, crash, "--max-restarts", "2", operator=observed(got))
    assert run.code == 0, run.story()
    value = got[0].registry.get_sample_value
    labels = {"run_id": "t", "node": "node"}
    assert value("ft_supervisor_generations_started_total", labels) == 2
    decided = {**labels, "action": "restart", "reason": "rank_failed"}
    assert value("ft_supervisor_decisions_total", decided) == 1
    crashed = next(e for e in run.named("rank_exited") if e["state"] == "failed")
    stepping = [e["t_mono"] for e in run.named("rank_stepping") if e["generation"] == 1]
    assert len(stepping) == 2
    assert value("ft_supervisor_recovery_seconds_count", labels) == 1
    recovery = max(stepping) - crashed["t_mono"]
    assert value("ft_supervisor_recovery_seconds_sum", labels) == pytest.approx(recovery)
    assert recovery == pytest.approx(1.0, abs=0.01)  # ready standbys take over: one step's time
