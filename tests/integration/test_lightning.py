"""A real Lightning Trainer (DDP over gloo, 2 CPU ranks) under the daemon, with FaultToleranceCallback."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import RANKS, Daemon

pytest.importorskip("lightning")
pytestmark = pytest.mark.torch

Start = Callable[..., Daemon]
SCRIPT = str(RANKS / "lightning_train.py")
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
    work = ("--max-steps", "30", "--every", "10", "--val-every", "10", "--autoresume")
    flag = tmp_path / "ok" / "finished"
    ok = start("--nproc-per-node", "2", *SECTIONS,
               SCRIPT, "--ckpt-dir", str(tmp_path / "ok" / "ckpt"), *work, env=_env(flag))  # fmt: skip
    assert ok.wait(timeout=120) == 0, ok.stderr()
    assert flag.exists()
    assert not ok.events("rank_hung")
    # max_steps is reached, then every rank raises: a failure, so no flag
    flag = tmp_path / "failed" / "finished"
    failed = start("--nproc-per-node", "2", *SECTIONS,
                   SCRIPT, "--ckpt-dir", str(tmp_path / "failed" / "ckpt"), *work, "--fail-at-end",
                   env=_env(flag))  # fmt: skip
    assert failed.wait(timeout=120) == 2  # a Python error, no restart left: abort
    assert "RuntimeError: injected failure after training, at step 30" in failed.stderr()
    assert not flag.exists()
    # without the variable the callback fails at setup, naming it
    unset = start("--nproc-per-node", "2", SCRIPT, "--ckpt-dir", str(tmp_path / "unset"), *work,
                  env=_env(None))  # fmt: skip
    assert unset.wait(timeout=120) == 2
    assert f"needs the {FLAG} environment variable" in unset.stderr()


@pytest.mark.slow
def test_simulated_fault_params_reach_the_faults_module(start: Start, tmp_path: Path) -> None:
    # nvidia-resiliency-ext's form, plus our generation: rank 1 is killed as generation 0 sets up
    fault = '{"fault_type": "rank_killed", "base_delay": 0, "rank_to_fail": 1, "generation": 0}'
    d = start("--nproc-per-node", "2", "--max-restarts", "1", *SECTIONS,
              SCRIPT, "--ckpt-dir", str(tmp_path / "ckpt"), "--max-steps", "20", "--simulated-fault", fault,
              env=_env(None))  # fmt: skip
    assert d.wait(timeout=120) == 0, d.story()
    gen0 = {e["rank"]: e for e in d.events("rank_exited") if e["generation"] == 0}
    assert gen0[1].get("signal") == "SIGKILL"
    out = d.stdout()
    assert "FT: simulating fault: rank_killed on rank 1" in out
    assert "simulating fault: rank_killed on rank 0" not in out
    run_dir = d.run_dir()
    assert run_dir is not None
    gen1 = (run_dir / "gen_1" / "local_rank_1" / "stdout.log").read_text()
    assert "finished at step 20" in gen1
    assert "simulating fault" not in gen1  # armed for generation 0 only
    assert "[rank 0 gen 1] finished at step 20" in out
