"""The client adapters under the real daemon: an NVRx script, Megatron's hooks, simulated faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.client import nvrx
from supervisor.client.faults import SimulatedFault
from supervisor.core.topology import ENV_PREFIX
from tests.support import RANKS, Daemon

NVRX = str(RANKS / "nvrx_style.py")
MEGATRON = str(RANKS / "megatron_style.py")
FAULTY = str(RANKS / "faulty.py")
FAST = ("--nproc-per-node", "2", "--preload", "none", "--max-restarts", "1")
Start = Callable[..., Daemon]


def _log(d: Daemon, generation: int, rank: int, name: str = "stderr.log") -> str:
    run_dir = d.run_dir()
    assert run_dir is not None
    return (run_dir / f"gen_{generation}" / f"local_rank_{rank}" / name).read_text()


def _hangs(d: Daemon) -> list[tuple[int, int, str, str | None]]:
    return [(e["generation"], e["rank"], e["kind"], e["section"]) for e in d.events("rank_hung")]


def _dumped_of_hung(d: Daemon) -> dict[str, Any]:
    """The stacks of the rank declared hung (every live rank's are dumped)."""
    hung = d.events("rank_hung")[0]
    return next(e for e in d.events("stacks_dumped") if (e["generation"], e["rank"]) == (0, hung["rank"]))


def _restarted_after(d: Daemon, reason: str) -> None:
    decisions = [(e["generation"], e["action"], e["reason"]) for e in d.events("decision")]
    assert decisions == [(0, "restart", reason)]
    assert "rank 0 generation 1 done" in d.stdout() and "rank 1 generation 1 done" in d.stdout()


def test_an_unmodified_nvrx_script_hangs_is_dumped_and_restarted(start: Start, tmp_path: Path) -> None:
    out = tmp_path / "out"
    d = start(*FAST, "--ft-rank-section-timeouts", "init:10,step:1,checkpoint:10",
              "--ft-rank-out-of-section-timeout", "10", "--ft-rank-heartbeat-timeout", "10",
              "--ft-learned-timeout-floor", "1",
              NVRX, "--output_dir", str(out), "--hang_rank", "0", "--hang_iter", "7")  # fmt: skip
    assert d.wait() == 0, d.story()
    # rank 1 (no collectives here) finished first and calculated the heartbeat timeout,
    # which applies to the whole node at once, as NVRx's all-reduced values do: rank 0's
    # silence or its step, whichever deadline came first
    assert [(g, r) for g, r, _, _ in _hangs(d)] == [(0, 0)]
    dumped = _dumped_of_hung(d)
    assert dumped["rank"] == 0 and "in training_loop" in dumped["stacks"]
    assert "in training_loop" in _log(d, 0, 0)
    _restarted_after(d, "rank_hung")
    assert not d.events("message_dropped")
    # as in NVRx, what the script calculated (step after its first epoch, checkpoint
    # after a save) was in force at once, and the end-of-generation rules taught
    # nothing more (no checkpoint was loaded, and asked values are the script's)
    calculated = {s for e in d.events("timeouts_calculated") for s in e["learned"]["sections"]}
    assert calculated >= {"step", "checkpoint"}
    assert not d.events("timeouts_learned")
    state = json.loads((out / "ft_state.json").read_text())
    assert set(state["current_timeouts"]["section"]["calculated_sections"]) >= {"step", "checkpoint"}


# what NVRx's RankMonitorClient.state_dict() wrote after a run under ft_launcher
NVRX_STATE = {
    "current_timeouts": {
        "heartbeat": {"initial": 120.0, "subsequent": 20.0, "were_calculated": True},
        "section": {
            "section": {"init": 40.0, "step": 3.5, "checkpoint": None},
            "out_of_section": 25.0,
            "calculated_sections": ["checkpoint", "step"],
            "is_out_of_section_calculated": True,
        },
    }
}


def test_an_nvrx_state_file_brings_its_timeouts_to_the_daemon(start: Start, tmp_path: Path) -> None:
    """A run moved from ft_launcher: NVRx's ft_state.json is loaded; what is monitored here applies."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "ft_state.json").write_text(json.dumps(NVRX_STATE))
    d = start(*FAST, "--ft-rank-section-timeouts", "init:10,step:10,checkpoint:10",
              "--ft-rank-heartbeat-timeout", "30", NVRX, "--output_dir", str(out))  # fmt: skip
    assert d.wait() == 0, d.story()
    # the daemon keeps all it was given, and applies what is monitored here: no
    # initial-heartbeat or out-of-section timeout is configured, so those are not
    restored = d.events("timeouts_restored")
    # NVRx's calculated values take precedence over the configuration, as in NVRx
    asked = ["heartbeat", "initial_heartbeat", "out_of_section", "section:step"]
    assert [e["timeouts"] for e in restored] == [
        {"initial_heartbeat": 120.0, "heartbeat": 20.0, "sections": {"step": 3.5}, "out_of_section": 25.0,
         "asked": asked}
    ]  # fmt: skip
    # rank 0: it reads the file before it rewrites it (rank 1, started late on a loaded
    # machine, may read rank 0's rewrite)
    assert "'step': 3.5" in _log(d, 0, 0, "stdout.log")  # section_timeouts after the load
    assert not d.events("rank_hung")  # no deadline appeared for what is not monitored
    # rank 0 rewrote the file, ours beside NVRx's, after the script calculated its timeouts
    # again (at the end of each phase): merged with the loaded ones, as NVRx's EMA does
    state = json.loads((out / "ft_state.json").read_text())
    learned = state["ft_supervisor_timeouts"]["learned"]
    assert 10.0 <= learned["heartbeat"] < 20.0
    assert 1.75 <= learned["sections"]["step"] < 3.5
    assert 12.5 <= learned["out_of_section"] < 25.0
    assert set(asked) <= set(learned["asked"])
    assert state["current_timeouts"]["heartbeat"]["subsequent"] == learned["heartbeat"]


def test_megatron_hooks_step_times_out_after_warmup(start: Start, tmp_path: Path) -> None:
    save = tmp_path / "save"
    # warm-up steps (0.7 s) exceed the step timeout, and together the setup one:
    # neither trips, because the hooks close `setup` at the first step and the
    # daemon exempts the first 2 steps; the hang in iteration 36 does trip. The ranks share
    # no collective: under load rank 0 may lag rank 1 by several steps, and only steps
    # before the hang began count, at least 16 on every rank
    d = start(*FAST, "--ft-rank-section-timeouts", "setup:1,step:0.5,checkpointing:5",
              "--ft-rank-out-of-section-timeout", "5", "--ft-num-warmup-iterations", "2",
              MEGATRON, "--save-dir", str(save), "--slow-warmup", "2", "--slow-time", "0.7", "--iters", "46",
              "--save-every", "8", "--eval-every", "10", "--hang-rank", "1", "--hang-iter", "36")  # fmt: skip
    assert d.wait() == 0, d.story()
    assert _hangs(d) == [(0, 1, "section", "step")]
    dumped = _dumped_of_hung(d)
    assert dumped["rank"] == 1 and "megatron_style.py" in dumped["stacks"]
    _restarted_after(d, "rank_hung")
    # 34 timed steps and completed saves in generation 0: `step` and `checkpointing` learned,
    # and kept by rank 0 in ft_state.json in both forms
    learned = d.events("timeouts_learned")[0]["learned"]
    assert {"step", "checkpointing"} <= set(learned["sections"])
    state = json.loads((save / "ft_state.json").read_text())
    assert state["ft_supervisor_timeouts"]["learned"]["sections"] == learned["sections"]
    assert {"step", "checkpointing"} <= set(state["current_timeouts"]["section"]["calculated_sections"])


RUN_ID = "t"  # the start fixture's --rdzv-id: TORCHELASTIC_RUN_ID, which seeds random choices


# the decision for each kind of fault: tests/fast/test_decisions.py; here the one whose
# real stacks matter (the main thread held in the fault's handler)
@pytest.mark.parametrize("desc", ["sleep;0;0.3;0"])
def test_simulated_faults_are_detected_and_recovered(start: Start, desc: str) -> None:
    fault = SimulatedFault.parse(desc)
    kind, rank, _ = fault.resolve(2, f"{RUN_ID}:0")  # what both ranks drew
    env = dict(os.environ, FT_SIM_FAULT_DESC=desc)
    d = start(*FAST, "--ft-rank-heartbeat-timeout", "0.5", "--ft-rank-section-timeouts", "step:5",
              FAULTY, env=env, run_id=RUN_ID)  # fmt: skip
    assert d.wait() == 0, d.story()
    assert f"rank {rank} generation 0 armed=True" in d.stdout()
    assert f"rank {1 - rank} generation 0 armed=False" in d.stdout()
    assert "generation 1 armed=True" not in d.stdout()  # generation 0 only
    assert f"FT: simulating fault: {kind} on rank {rank}" in _log(d, 0, rank)
    assert kind == "sleep"
    assert _hangs(d) == [(0, rank, "heartbeat", None)]
    dumped = _dumped_of_hung(d)
    assert dumped["rank"] == rank and "faulty.py" in dumped["stacks"]
    # the main thread, stuck in the fault's handler
    assert "faults.py" in dumped["stacks"] and "in handler" in dumped["stacks"]
    _restarted_after(d, "rank_hung")


def _by_hand(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The script run without a daemon, as `python script.py` would run it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update(RANK="0", TORCHELASTIC_RESTART_COUNT="0")
    return subprocess.run([sys.executable, script, *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_without_a_daemon_the_adapters_are_no_ops_and_keep_the_state_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "ft_state.json").write_text(json.dumps(NVRX_STATE))
    r = _by_hand(NVRX, "--output_dir", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "rank 0 generation 0 done" in r.stdout
    assert r.stderr.count("no ft-supervisor daemon supervises this process") == 1
    # the script saved its FT state as usual: what it had loaded, not an empty state
    saved = json.loads((out / "ft_state.json").read_text())
    assert nvrx.learned_from_state(saved) == nvrx.learned_from_state(NVRX_STATE)

    save = tmp_path / "save"
    r = _by_hand(MEGATRON, "--save-dir", str(save), "--save-every", "8", "--eval-every", "10", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "rank 0 generation 0 done" in r.stdout
    assert r.stderr.count("no ft-supervisor daemon supervises this process") == 1
    assert not (save / "ft_state.json").exists()  # nothing learned, nothing written


def _chain(steps: int) -> int:
    """megatron_style.py's training state after ``steps`` steps from the beginning."""
    work = 0
    for iteration in range(steps):
        work = (work * 31 + iteration) % (2**61 - 1)
    return work


def test_megatron_hooks_resume_from_the_memory_snapshot_newer_than_the_disk(
    start: Start, tmp_path: Path
) -> None:
    # a snapshot after every step (on_training_step_end(snapshot=)), latest.txt every 4; rank 1
    # is SIGKILLed after iteration 5's step: memory holds iteration 6 (5 if the kill cut off its
    # done message), the disk 4; ft.restore gives the memory's, the newer, to both ranks
    d = start(*FAST, MEGATRON, "--save-dir", str(tmp_path / "save"), "--iters", "8", "--save-every", "4",
              "--snapshot", "--kill-rank", "1", "--kill-iter", "5")  # fmt: skip
    assert d.wait() == 0, d.story()
    restored = {e["step"] for e in d.events("snapshot_restored")}
    assert len(restored) == 1, d.story()
    (step,) = restored
    assert step in (5, 6), d.story()
    out, err = d.stdout(), d.stderr()
    for rank in (0, 1):
        assert f"rank {rank} generation 1 starts at {step} with work {_chain(step)}" in out, out
    line = f"resuming at step {step} from memory: newer than the disk checkpoint (memory snapshot at step"
    assert err.count(line) == 2, err
    chosen = {(e["generation"], e["rank"], e["source"], e["step"]) for e in d.events("resume_chosen")}
    assert {(1, 0, "memory", step), (1, 1, "memory", step)} <= chosen, chosen  # the daemon heard the choice
    assert "rank 0 generation 1 done" in out


def test_nvrx_shim_resumes_from_the_memory_snapshot(start: Start, tmp_path: Path) -> None:
    # end_section("step", snapshot=(step, state)) at every step; checkpoints at the end of each
    # 6-step epoch; rank 1 is SIGKILLed after step 2 of epoch 1 (global step 9): the client's
    # restore(disk_step) gives memory's step 9 (8 if the kill cut off its done), newer than 6
    out = tmp_path / "out"
    # no warm-up: the script asks for its step timeout after the few steps of a resumed epoch
    d = start(*FAST, "--ft-rank-section-timeouts", "init:10,step:10,checkpoint:10",
              "--ft-num-warmup-iterations", "0", NVRX, "--output_dir", str(out), "--epochs", "2",
              "--iters", "6", "--snapshot", "--kill_rank", "1", "--kill_iter", "2")  # fmt: skip
    assert d.wait() == 0, d.story()
    restored = {e["step"] for e in d.events("snapshot_restored")}
    assert len(restored) == 1, d.story()
    (step,) = restored
    assert step in (8, 9), d.story()
    progress = {"epoch_idx": 1, "iter_idx": step - 6}
    assert all(f"rank {r} generation 1 resumes at {progress}" in d.stdout() for r in (0, 1)), d.stdout()
    # (a rank started late may find the checkpoint rank 0 saved in this generation, not its own
    # to resume from: it says "no disk checkpoint", still from memory)
    assert d.stderr().count(f"resuming at step {step} from memory: ") == 2, d.stderr()
    assert "rank 0 generation 1 done" in d.stdout()
