"""Decisions on real training code nobody here wrote the way of (issue 11): the right rank,
the right timeout, the right action.

Lightning's own BoringModel with FaultToleranceCallback, a script in the style of
PyTorch's DDP tutorial, NVRx code through the shim (null timeouts and
calculate_and_set_*), and NVRx's client imported unchanged (served by ours; NVRx's own
outside the rank bootstrap). Each asserts the decision, the rank blamed, the timeouts in
force afterwards, and that ``ft-supervisor classify`` agrees with the daemon's reason.json.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from tests.support import LIGHTNING_PRELOAD, RANKS, Daemon

pytestmark = pytest.mark.torch

Start = Callable[..., Daemon]
BORING = str(RANKS / "lightning_boring.py")
SECTIONS = ("--ft-rank-section-timeouts", "setup:120,step:3,checkpointing:60")


def _decisions(d: Daemon) -> list[tuple[int, str, str, int | None, str | None]]:
    return [(e["generation"], e["action"], e["reason"], e["rank"], e["rule"]) for e in d.events("decision")]


def _reason(d: Daemon) -> dict[str, Any]:
    run_dir = d.run_dir()
    assert run_dir is not None
    reason: dict[str, Any] = json.loads((run_dir / "reason.json").read_text())
    return reason


def _classify_agrees(d: Daemon) -> dict[str, Any]:
    """``ft-supervisor classify RUN_DIR --json``: the same rule, rank and action as reason.json."""
    from supervisor.cli.classify import classify_run  # noqa: PLC0415

    run_dir = d.run_dir()
    assert run_dir is not None
    found, problems = classify_run(run_dir)
    assert not problems, problems
    return found


@pytest.mark.slow
def test_lightning_boring_model_crash_while_its_peer_waits_is_no_hang_then_a_hang_blames_the_stuck_rank(
    start: Start, tmp_path: Path
) -> None:
    """One run of Lightning's BoringModel, two faults of rank 1. Generation 0: it raises at
    step 25 and takes 5 s to exit (past the 3 s step timeout): rank 0 waits in the
    all-reduce for a peer that already failed; that is not a new hang. Generation 1
    (resumed from step 20): it hangs in training_step at step 45; rank 0 opened the step
    first and waits in DDP's all-reduce: its deadline fires, but rank 1 is the one
    declared hung and killed. Generation 2 resumes from step 40 and finishes."""
    d = start("--nproc-per-node", "2", "--max-restarts", "2", *SECTIONS, *LIGHTNING_PRELOAD, BORING,
              "--ckpt-dir", str(tmp_path / "ckpt"), "--fault", "raise,hang", "--fault-step", "25,45",
              "--slow-exit", "5")  # fmt: skip
    assert d.wait(timeout=200) == 0, d.story()
    assert _decisions(d) == [(0, "restart", "rank_failed", 1, "P9"), (1, "restart", "rank_hung", 1, "HANG")]
    # generation 0: the crash, and no hang
    assert [e["rank"] for e in d.events("deadline_ignored") if e["generation"] == 0] == [0]
    # the exiting rank was not signalled for its stacks
    assert not [e for e in d.events("stacks_dumped") if e["generation"] == 0]
    failed = {e["rank"]: (e["exit_code"], e["signal"]) for e in d.events("rank_exited")
              if e["state"] == "failed" and e["generation"] == 0}  # fmt: skip
    # rank 1 exits with its own status; on a loaded machine rank 0 may read the reset of
    # rank 1's teardown and exit first, and rank 1 is stopped on its way out: its client
    # reported its exception before the stop, so it is still the one that failed
    assert failed.get(1, (1, None)) == (1, None) and set(failed) <= {0, 1} and failed
    # generation 1: the hang; rank 0's deadline fired first (and no deadline in generation 0)...
    missed = d.events("deadline_missed")
    assert [(e["generation"], e["rank"], e["section"]) for e in missed] == [(1, 0, "step")]
    # ...but rank 1, stuck in training_step, is the one declared hung and killed
    hung = d.events("rank_hung")
    assert [(e["generation"], e["rank"], e["blamed_by"], e["deadline_rank"]) for e in hung] == [
        (1, 1, "stacks", 0)
    ]
    assert "rank 1: own (training_step" in hung[0]["evidence"]
    assert [e["signal"] for e in d.events("rank_exited") if e["rank"] == 1 and e["generation"] == 1] == [
        "SIGKILL"
    ]
    assert _reason(d)["last_failure"]["rank"] == 1
    # the hung step and the peers' waits taught nothing: step learned from healthy steps only
    learned = d.events("timeouts_learned")
    assert learned and all(e["learned"]["sections"]["step"] < 3.0 for e in learned), learned
    assert learned[-1]["in_force"]["sections"]["step"] == 3.0  # the configured value stands
    assert "setup" in learned[-1]["learned"]["sections"]  # generations 1 and 2 loaded last.ckpt
    out = d.stdout()
    # each generation resumed from ModelCheckpoint's last save before its fault, and the last finished
    assert all(f"rank {r} generation 1: training from step 20" in out for r in (0, 1))
    assert all(f"rank {r} generation 2: training from step 40" in out for r in (0, 1))
    assert all(f"rank {r} generation 2: finished at step 80" in out for r in (0, 1))
    found = _classify_agrees(d)
    judged = [(j["generation"], j["rule"], j["rank"]) for j in found["decisions"]]
    assert judged == [(0, "P9", 1), (1, "HANG", 1)]
    assert found["last_failure"]["rank"] == 1


@pytest.mark.slow
def test_ddp_tutorial_two_kills_an_epoch_apart_restart_twice(start: Start, tmp_path: Path) -> None:
    # no client, so no progress reports: a second SIGKILL after real training is not
    # taken for a repeat, and restarts are spent as torchrun spends them
    d = start("--nproc-per-node", "2", "--max-restarts", "3", str(RANKS / "ddp_tutorial.py"),
              "--checkpoint", str(tmp_path / "ck.pt"), "--steps", "90", "--save-every", "15",
              "--step-time", "0.005", "--kill-at", "20,70")  # fmt: skip
    assert d.wait(timeout=150) == 0, d.story()
    assert _decisions(d) == [
        (0, "restart", "rank_failed", 1, "X-SIGKILL"),
        (1, "restart", "rank_failed", 1, "X-SIGKILL"),
    ]
    assert "rank 1: resumed at step 60" in d.stdout()
    assert not d.events("rank_hung")
    assert _reason(d)["restarts_used"] == 2


@pytest.mark.slow
def test_nvrx_heartbeats_null_timeouts_calculated_at_once_find_a_stopped_rank(
    start: Start, tmp_path: Path
) -> None:
    config = tmp_path / "ft.yaml"  # as NVRx's fault_tol_cfg_heartbeats.yaml
    config.write_text(
        "fault_tolerance:\n  initial_rank_heartbeat_timeout: null\n  rank_heartbeat_timeout: null\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    d = start("--nproc-per-node", "2", "--max-restarts", "1", "--ft-cfg-path", str(config),
              "--ft-learned-timeout-floor", "2", str(RANKS / "nvrx_heartbeats.py"),
              "--output-dir", str(out))  # fmt: skip
    assert d.wait(timeout=150) == 0, d.story()
    # nothing was enforced, and the daemon said so, until the script calculated them
    assert d.events("heartbeats_unmonitored")
    calculated = d.events("timeouts_calculated")[0]
    assert calculated["in_force"]["heartbeat"] == 2.0  # at once, at the floor
    # the initial one covers init to the first heartbeat, as seen (longer on a busy node)
    calc = r"calculated HeartbeatTimeouts\(initial=([\d.]+), subsequent=2.0, were_calculated=True\)"
    initial = re.search(calc, d.stdout())
    assert initial is not None and float(initial[1]) >= 2.0, d.stdout()
    hung = d.events("rank_hung")
    assert [(e["rank"], e["kind"], e["blamed_by"]) for e in hung] == [(1, "heartbeat", "stacks")]
    assert "stopped (SIGSTOP" in hung[0]["evidence"]
    assert hung[0]["open_for"] >= 2.0
    assert _decisions(d) == [(0, "restart", "rank_hung", 1, "HANG")]
    # generation 1 loaded the calculated timeouts from the checkpoint and finished
    assert f"rank 1 generation 1 starts at epoch 1: HeartbeatTimeouts(initial={initial[1]}" in d.stdout()
    assert "rank 1 generation 1 done" in d.stdout()
    assert _classify_agrees(d)["last_failure"]["rank"] == 1


def test_unchanged_nvrx_code_runs_on_the_daemons_client(start: Start) -> None:
    pytest.importorskip("nvidia_resiliency_ext")
    d = start("--nproc-per-node", "2", "--preload", "none", str(RANKS / "nvrx_unchanged.py"))
    assert d.wait(timeout=60) == 0, d.story()
    assert not d.events("decision")
    [served] = d.events("nvrx_served")  # once, for both ranks
    assert served["version"] == version("nvidia-resiliency-ext")


def test_unchanged_nvrx_code_outside_the_rank_bootstrap_is_a_setup_error_that_spends_no_restart(
    start: Start,
) -> None:
    # --no-python: the program is exec'd, so NVRx's own client loads and needs ft_launcher
    pytest.importorskip("nvidia_resiliency_ext")
    d = start("--nproc-per-node", "2", "--max-restarts", "3", "--no-python",
              sys.executable, str(RANKS / "nvrx_unchanged.py"))  # fmt: skip
    assert d.wait(timeout=60) == 2, d.stderr()
    [decision] = d.events("decision")
    assert (decision["action"], decision["rule"], decision["restarts_used"]) == ("abort", "P0-NVRX", 0)
    assert "--no-python" in decision["detail"]
    assert "import supervisor.client.nvrx as fault_tolerance" in decision["detail"]
    assert not d.events("nvrx_served")
    assert _classify_agrees(d)["classification"]["rule"] == "P0-NVRX"


def test_what_a_killed_ranks_forked_helper_says_after_its_death_decides_nothing(start: Start) -> None:
    # its helper dies of a real "Connection reset by peer" into the rank's log, and its
    # inherited excepthook reports it as the rank's: the rank's own SIGKILL decides
    d = start("--nproc-per-node", "2", "--max-restarts", "1", "--preload", "none",
              str(RANKS / "orphan_speaks.py"))  # fmt: skip
    assert d.wait(timeout=60) == 0, d.story()
    assert _decisions(d) == [(0, "restart", "rank_failed", 1, "X-SIGKILL")]
    # the helper's report is told apart by its pid (when it arrives before the generation ends)
    assert all(e["exc_type"] == "ConnectionResetError" for e in d.events("child_exception"))
    assert _classify_agrees(d)["last_failure"]["rule"] == "X-SIGKILL"


def test_a_heartbeat_timeout_the_user_set_is_never_tightened_by_learning(start: Start) -> None:
    # issue 11: --ft-rank-heartbeat-timeout 3 with 100 ms steps learned 1 s, which then
    # declared a rank hung while it waited for its failing peer
    d = start("--nproc-per-node", "2", "--preload", "none", "--ft-rank-heartbeat-timeout", "3",
              str(RANKS / "monitored.py"), "--heartbeat", "--steps", "24", "--step-time", "0.1",
              "--checkpoint-every", "8")  # fmt: skip
    assert d.wait(timeout=60) == 0, d.story()
    [learned] = d.events("timeouts_learned")
    assert 0.5 <= learned["learned"]["heartbeat"] < 1.5  # 5 x the longest gap (about 0.2 s)
    assert learned["in_force"]["heartbeat"] == 3.0  # the user's value stands


@pytest.mark.slow
def test_an_nccl_error_raised_through_finally_is_the_cause_not_the_peers_reset(start: Start) -> None:
    # the goodput benchmark's schedule: rank 1 raised NCCL's watchdog timeout; its
    # `finally` closed the process group, rank 0 read the reset and exited first, and the
    # decision named rank 0 with D5 while we stopped rank 1 as it printed its error
    # who exits first is a race (either order, once); with a slow exit, rank 1 is always
    # stopped on its way out
    for slow_exit in ("0", "3"):
        d = start("--nproc-per-node", "2", "--max-restarts", "1", str(RANKS / "nccl_raise.py"),
                  "--slow-exit", slow_exit)  # fmt: skip
        assert d.wait(timeout=120) == 0, d.story()
        assert _decisions(d) == [(0, "restart", "rank_failed", 1, "N1")]
        assert "rank 1 generation 1: done" in d.stdout()
        assert _classify_agrees(d)["last_failure"]["rule"] == "N1"
