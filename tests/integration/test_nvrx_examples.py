"""NVRx code unchanged under ft-supervisor (issue 22): nvidia-resiliency-ext's own
fault-tolerance examples (tests/fixtures/ranks/nvrx_examples, vendored as they are)
import ``nvidia_resiliency_ext.fault_tolerance`` and get ft-supervisor's client in its
place. Each example survives a crash and then a hang of one rank, the signals its own
``--simulated_fault`` sends (SIGKILL, SIGSTOP), sent here from outside at a known
point so that the rank and the moment are known: the right rank is blamed for each,
and the job finishes. ``scripts/bench/nvrx_examples.py`` runs the same under
ft_launcher."""

from __future__ import annotations

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
# three generations of torch ranks each: deadlines are backstops for a loaded machine
pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(300)]

Start = Callable[..., Daemon]
EXAMPLES = RANKS / "nvrx_examples"
# a hang's diagnostic bundle (py-spy) is not what these tests are about: no time spent on it
LAUNCH = ("--nproc-per-node", "2", "--max-restarts", "2", "--ft-bundle-timeout", "0")
# small and short: 20 steps an epoch, 3 epochs (a crash in the 2nd, a hang in the 3rd);
# the examples' own options
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


def _crash_then_hang(d: Daemon) -> None:
    """Rank 1 is SIGKILLed as epoch 1 starts (generation 0), then SIGSTOPped as epoch 2
    starts (generation 1); generation 2 resumes from the example's checkpoint and ends."""
    _at_epoch(d, 1, 1)
    os.kill(_pid(d, 1), signal.SIGKILL)
    _at_epoch(d, 1, 2)
    os.kill(_pid(d, 1), signal.SIGSTOP)
    assert d.wait(timeout=240) == 0, d.story()
    assert _decisions(d) == [
        (0, "restart", "rank_failed", 1, "X-SIGKILL"),
        (1, "restart", "rank_hung", 1, "HANG"),
    ], d.story()
    # the stopped rank, not its peer waiting for it in DDP's all-reduce
    [hung] = d.events("rank_hung")
    assert hung["rank"] == 1, hung
    # one event names the NVRx the unchanged code was served as
    [served] = d.events("nvrx_served")
    assert served["version"] == version("nvidia-resiliency-ext"), served


def test_nvrx_heartbeats_example_unchanged_survives_a_crash_and_a_hang(start: Start, tmp_path: Path) -> None:
    d = start(*LAUNCH,
              "--ft-initial-rank-heartbeat-timeout", "60", "--ft-rank-heartbeat-timeout", "3",
              str(EXAMPLES / "train_ddp_heartbeats_api.py"), *SMALL,
              "--output_dir", str(tmp_path / "out"))  # fmt: skip
    _crash_then_hang(d)
    assert d.events("rank_hung")[0]["kind"] == "heartbeat"


def test_nvrx_sections_example_unchanged_survives_a_crash_and_a_hang(start: Start, tmp_path: Path) -> None:
    d = start(*LAUNCH,
              "--ft-rank-section-timeouts", "init:60,step:3,checkpoint:60",
              # the example calculates its section timeouts: they are never below the floor
              "--ft-rank-out-of-section-timeout", "8", "--ft-learned-timeout-floor", "5",
              str(EXAMPLES / "train_ddp_sections_api.py"), *SMALL,
              "--output_dir", str(tmp_path / "out"))  # fmt: skip
    _crash_then_hang(d)


def test_nvrx_lightning_callback_unchanged_survives_a_crash_and_a_hang(start: Start, tmp_path: Path) -> None:
    # nvidia_resiliency_ext.ptl_resiliency.FaultToleranceCallback on Lightning's BoringModel
    pytest.importorskip("lightning")
    d = start(*LAUNCH,
              # the callback calculates the heartbeat timeout: it is never below the floor
              "--ft-initial-rank-heartbeat-timeout", "60", "--ft-rank-heartbeat-timeout", "3",
              "--ft-learned-timeout-floor", "5", *LIGHTNING_PRELOAD, str(RANKS / "nvrx_lightning.py"),
              "--dir", str(tmp_path / "exp"), "--crash-step", "25", "--hang-step", "45")  # fmt: skip
    assert d.wait(timeout=240) == 0, d.story()
    assert _decisions(d) == [(0, "restart", "rank_failed", 1, "P9"), (1, "restart", "rank_hung", 1, "HANG")]
    assert [e["rank"] for e in d.events("rank_hung")] == [1]
    assert all(f"rank {r} generation 2: finished at step 60" in d.stdout() for r in (0, 1)), d.story()
    assert len(d.events("nvrx_served")) == 1
    # the callback saved NVRx's form of the timeouts (and ours beside it) with our state_dict
    state = json.loads((tmp_path / "exp" / "_ft_state.json").read_text())
    assert "current_timeouts" in state and "ft_supervisor_timeouts" in state, state
