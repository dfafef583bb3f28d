"""NVRx code unchanged under ft-supervisor (issue 22): nvidia-resiliency-ext's own
fault-tolerance examples (tests/fixtures/ranks/nvrx_examples, vendored as they are)
import ``nvidia_resiliency_ext.fault_tolerance`` and get ft-supervisor's client in its
place. Each example survives one fault of one rank, the signals its own
``--simulated_fault`` sends, sent here from outside at a known point so that the rank
and the moment are known: the heartbeats example a hang (SIGSTOP) under its own
configuration, the sections example a crash (SIGKILL). The right rank is blamed, and the
job resumes from the example's checkpoint and finishes. (Either fault on either example
costs a generation, about 5 s of torch.optim importing torch._dynamo in both ranks: the
decisions on a crash-then-hang story are tests/fast/test_decisions.py's.)
``scripts/bench/nvrx_examples.py`` runs both faults on both examples, under ft_launcher too."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.support import LIGHTNING_PRELOAD, RANKS, Daemon, wait_until

pytest.importorskip("nvidia_resiliency_ext")
# torch ranks: deadlines are backstops for a loaded machine
pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(300)]

Start = Callable[..., Daemon]
EXAMPLES = RANKS / "nvrx_examples"
# one fault, one restart; a hang's diagnostic bundle (py-spy) is not what these tests are about
LAUNCH = ("--nproc-per-node", "2", "--max-restarts", "1", "--ft-bundle-timeout", "0")
# small and short: 20 steps an epoch, 3 epochs (the fault in the 2nd); the examples' own options
SMALL = ("--device", "cpu", "--hidden", "16", "--batch", "2", "--train_dataset_size", "80",
         "--val_dataset_size", "8", "--epochs", "3", "--logging_interval", "100",
         "--log_all_ranks")  # fmt: skip


def _decisions(d: Daemon) -> list[tuple[int, str, str, int | None, str | None]]:
    return [(e["generation"], e["action"], e["reason"], e["rank"], e["rule"]) for e in d.events("decision")]


def _pid(d: Daemon, rank: int) -> int:
    """The rank's pid as the example logs it (``RANK=1 PID=...``): the latest generation's."""
    found = re.findall(rf"RANK={rank} PID=(\d+)", d.stderr())
    return int(found[-1])


def _at_epoch(d: Daemon, rank: int, epoch: int) -> None:
    line = f"{rank}: CHECK TRAIN epoch: {epoch:4d} iter: {0:5d}"
    wait_until(lambda: line in d.stderr() or d.proc.poll() is not None, 120, line)
    assert d.proc.poll() is None, d.story()


def _recovered(d: Daemon, decision: tuple[int, str, str, int | None, str | None]) -> None:
    """The decision, then generation 1 resumed from the example's checkpoint and finished."""
    assert d.wait(timeout=240) == 0, d.story()
    assert _decisions(d) == [decision], d.story()
    run_dir = d.run_dir()
    assert run_dir is not None
    for rank in (0, 1):
        log = (run_dir / "gen_1" / f"local_rank_{rank}" / "stderr.log").read_text()
        assert f"{rank}: Checkpoint was loaded from file" in log, log
    # one event names the NVRx the unchanged code was served as
    [served] = d.events("nvrx_served")
    assert served["version"] == version("nvidia-resiliency-ext"), served


def test_nvrx_heartbeats_example_unchanged_under_its_own_config_finds_a_stopped_rank(
    start: Start, tmp_path: Path
) -> None:
    # NVRx's fault_tol_cfg_heartbeats.yaml as it is: both heartbeat timeouts null. Nothing is
    # enforced, and the daemon says so, until the example calls calculate_and_set_hb_timeouts()
    # (epoch 1, iteration 1): in force at once, never below the floor. Its largest gap between
    # heartbeats (an epoch's end) is about 0.4 s here, loaded or not: 3 s leaves generation 1
    # the margin a configured 3 s did
    d = start(*LAUNCH, "--ft-cfg-path", str(EXAMPLES / "fault_tol_cfg_heartbeats.yaml"),
              "--ft-learned-timeout-floor", "3",
              str(EXAMPLES / "train_ddp_heartbeats_api.py"), *SMALL,
              "--output_dir", str(tmp_path / "out"))  # fmt: skip
    calculated = d.wait_event("timeouts_calculated", 120)[0]  # rank 1 steps on for a moment
    os.kill(_pid(d, 1), signal.SIGSTOP)
    _recovered(d, (0, "restart", "rank_hung", 1, "HANG"))
    [unmonitored] = d.events("heartbeats_unmonitored")
    assert unmonitored["generation"] == 0
    assert calculated["generation"] == 0 and set(calculated["learned"]["asked"]) == {
        "heartbeat", "initial_heartbeat"}  # fmt: skip
    assert calculated["in_force"]["heartbeat"] >= 3.0, calculated
    # the stopped rank, by the calculated timeout, not its peer waiting for it in DDP's all-reduce
    # (rank 1's own calculation, if it asked before it stopped, is the one in force)
    [hung] = d.events("rank_hung")
    missed = d.events("deadline_missed")[0]["t_mono"]
    before = [e for e in d.events("timeouts_calculated") if e["t_mono"] <= missed]
    in_force = before[-1]["in_force"]["heartbeat"] if before else None
    assert (hung["rank"], hung["kind"], hung["timeout"]) == (1, "heartbeat", in_force), (hung, before)
    # generation 1's clients held the calculated timeouts from the start: the example, which
    # calculates only while its client says they are not valid, did not calculate again
    assert {e["generation"] for e in d.events("timeouts_calculated")} == {0}


def test_nvrx_sections_example_unchanged_survives_a_crash(start: Start, tmp_path: Path) -> None:
    d = start(*LAUNCH,
              "--ft-rank-section-timeouts", "init:60,step:3,checkpoint:60",
              # the example calculates its section timeouts: they are never below the floor
              "--ft-rank-out-of-section-timeout", "8", "--ft-learned-timeout-floor", "5",
              # the example ignores SIGTERM (it sets a flag); its peer would wait in gloo for
              # the killed rank's DataLoader workers, which hold its sockets until their
              # watchdog sees their parent gone (5 s): killed after 1 s instead
              "--workers-stop-timeout", "1",
              str(EXAMPLES / "train_ddp_sections_api.py"), *SMALL,
              "--output_dir", str(tmp_path / "out"))  # fmt: skip
    _at_epoch(d, 1, 1)
    os.kill(_pid(d, 1), signal.SIGKILL)
    _recovered(d, (0, "restart", "rank_failed", 1, "X-SIGKILL"))
    assert not d.events("rank_hung")
    # the sections' timeouts the example calculated (step after its first epoch, checkpoint
    # after its first save) were in force before the crash
    calculated = {s for e in d.events("timeouts_calculated") if e["generation"] == 0
                  for s in e["learned"]["sections"]}  # fmt: skip
    assert calculated >= {"step", "checkpoint"}, d.events("timeouts_calculated")


def test_nvrx_lightning_callback_unchanged_survives_a_hang(start: Start, tmp_path: Path) -> None:
    # nvidia_resiliency_ext.ptl_resiliency.FaultToleranceCallback on Lightning's BoringModel;
    # its heartbeats find rank 1 asleep in training_step while rank 0 waits in the all-reduce
    # (a real Lightning crash and restart: tests/integration/test_lightning.py; the crash then
    # the hang, decided: tests/fast/test_decisions.py)
    if importlib.util.find_spec("lightning") is None:  # not imported here: 5 CPU-s
        pytest.skip("lightning is not installed")
    d = start(*LAUNCH,
              # the callback calculates the heartbeat timeout: it is never below the floor
              "--ft-initial-rank-heartbeat-timeout", "60", "--ft-rank-heartbeat-timeout", "3",
              "--ft-learned-timeout-floor", "5", *LIGHTNING_PRELOAD, str(RANKS / "nvrx_lightning.py"),
              "--dir", str(tmp_path / "exp"), "--max-steps", "40", "--hang-step", "25")  # fmt: skip
    assert d.wait(timeout=240) == 0, d.story()
    assert _decisions(d) == [(0, "restart", "rank_hung", 1, "HANG")]
    assert [(e["rank"], e["kind"]) for e in d.events("rank_hung")] == [(1, "heartbeat")]
    # generation 1 resumed from Lightning's last checkpoint (step 20) and finished
    assert all(f"rank {r} generation 1: finished at step 40" in d.stdout() for r in (0, 1)), d.story()
    assert len(d.events("nvrx_served")) == 1
    # the callback saved NVRx's form of the timeouts (and ours beside it) with our state_dict
    state = json.loads((tmp_path / "exp" / "_ft_state.json").read_text())
    assert "current_timeouts" in state and "ft_supervisor_timeouts" in state, state
