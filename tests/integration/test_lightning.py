"""Real Lightning Trainers (DDP over gloo, 2 CPU ranks) under the daemon, with our callbacks,
under both of Lightning's import names (lightning.pytorch, pytorch_lightning)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import LIGHTNING_PRELOAD, PL_PRELOAD, RANKS, Daemon

# looked up, not imported: importing Lightning here cost every xdist worker ~5 CPU-s at collection,
# and only the ranks need it
if importlib.util.find_spec("lightning") is None:
    pytest.skip("lightning is not installed", allow_module_level=True)
pytestmark = pytest.mark.torch

Start = Callable[..., Daemon]
SCRIPT = str(RANKS / "lightning_train.py")
PACKAGES = str(RANKS / "lightning_packages.py")
FLAG = "FAULT_TOL_FINISHED_FLAG_FILE"
SECTIONS = ("--ft-rank-section-timeouts", "setup:120,step:3,checkpointing:60")


def _env(flag: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != FLAG}
    if flag is not None:
        env[FLAG] = str(flag)
    return env


def _learned(d: Daemon, generation: int) -> dict[str, float]:
    event = next(e for e in d.events("timeouts_learned") if e["generation"] == generation)
    sections: dict[str, float] = event["learned"]["sections"]
    return sections


@pytest.mark.slow
def test_autoresume_creates_the_finished_flag_on_success_only(start: Start, tmp_path: Path) -> None:
    # One run, both outcomes. Generation 0 trains to max_steps (checkpoints, validation),
    # then every rank raises in on_train_end: a failure, so no flag, although max_steps was
    # reached (rank 0 would create it). Generation 1 resumes from last.ckpt, at max_steps:
    # training has finished, so the flag (where $FAULT_TOL_FINISHED_FLAG_FILE says).
    work = ("--max-steps", "30", "--every", "10", "--val-every", "10", "--autoresume", "--fail-at-end")
    flag = tmp_path / "finished"
    d = start("--nproc-per-node", "2", "--max-restarts", "1", *SECTIONS, *LIGHTNING_PRELOAD,
              SCRIPT, "--ckpt-dir", str(tmp_path / "ckpt"), *work, env=_env(flag))  # fmt: skip
    assert d.wait(timeout=120) == 0, d.story()
    assert "RuntimeError: injected failure after training, at step 30" in d.stderr()
    assert [(e["generation"], e["action"]) for e in d.events("decision")] == [(0, "restart")], d.story()
    out = d.stdout()
    # the ranks of generation 1 looked before training: generation 0's failure left no flag
    assert all(f"[rank {r} gen 0] finished flag present at start: False" in out for r in (0, 1)), out
    assert all(f"[rank {r} gen 1] finished flag present at start: False" in out for r in (0, 1)), out
    assert flag.exists()
    assert not d.events("rank_hung")
    # its heartbeats are unused, not a hang left unnoticed: the sections hold the ranks
    assert not d.events("heartbeats_unmonitored")


@pytest.mark.slow
def test_nvrx_style_sections_callback_under_pytorch_lightning_recovers_from_a_crash(start: Start) -> None:
    # Lightning's BoringModel under the other import name; the callback built positionally as
    # NVRx code builds it, autoresume=True without FAULT_TOL_FINISHED_FLAG_FILE in the environment,
    # and NVRx's simulated_fault_params (plus our generation): rank 1 raises as generation 0 starts
    fault = '{"fault_type": "exception", "base_delay": 0, "rank_to_fail": 1, "generation": 0}'
    d = start("--nproc-per-node", "2", "--max-restarts", "1", *SECTIONS, *PL_PRELOAD, PACKAGES,
              "--package", "pytorch_lightning", "--simulated-fault", fault, env=_env(None))  # fmt: skip
    assert d.wait(timeout=120) == 0, d.story()
    assert [(e["generation"], e["action"], e["rank"]) for e in d.events("decision")] == [(0, "restart", 1)]
    out = d.stdout()
    assert "FT: simulating fault: exception on rank 1" in out
    assert "simulating fault: exception on rank 0" not in out
    # the exception handling policy's request reached the daemon
    requests = {(e["rank"], e["action"], e["reason"]) for e in d.events("workload_request")}
    assert (1, "continue", "policy saw SimulatedFaultError") in requests
    assert all(f"[rank {r} gen 1] finished at step 6 with pytorch_lightning" in out for r in (0, 1))
    # the daemon gave the ranks a finished flag of their own: created, no setup error
    run_dir = d.run_dir()
    assert run_dir is not None and (run_dir / "finished").exists()
    assert not d.events("heartbeats_unmonitored")
    gen1 = (run_dir / "gen_1" / "local_rank_1" / "stdout.log").read_text()
    assert "simulating fault" not in gen1  # armed for generation 0 only


@pytest.mark.slow
def test_lightning_pytorch_boring_model_without_the_flag_variable(start: Start) -> None:
    # docs/guides/torchrun.md's line, section timeouts only, nothing else set: no setup error, no warning
    d = start("--nproc-per-node", "1", *SECTIONS, *LIGHTNING_PRELOAD, PACKAGES,
              "--package", "lightning.pytorch", "--callback", "FaultToleranceCallback", "--max-steps", "3",
              "--then-other", env=_env(None))  # fmt: skip
    assert d.wait(timeout=120) == 0, d.story()
    run_dir = d.run_dir()
    assert run_dir is not None and (run_dir / "finished").exists()
    daemon = [line for line in d.stderr().splitlines() if line.startswith("[ft-supervisor]")]
    assert daemon and not [line for line in daemon if " WARNING " in line], d.stderr()
    # once both packages are imported, a callback is one of both: either Trainer takes it alone
    # (Lightning type-checks a callback given alone), also once pickled (ddp_spawn)
    out = d.stdout()
    assert "[rank 0 gen 0] a callback of both lightning.pytorch and pytorch_lightning" in out
    # arguments that cannot work fail at once, as a setup error (rule P0-SETUP: no restart)
    assert (
        "SetupError: FaultToleranceSectionsCallback: simulated_fault_params: unknown field(s) ['rank']" in out
    )
    assert "SetupError: FaultToleranceSectionsCallback(exc_handling_policy=...): a function" in out
