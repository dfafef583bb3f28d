"""Decisions on real training code nobody here wrote the way of (issue 11): what needs
the real code. NVRx code through the shim in a torch rank (null timeouts and
calculate_and_set_*), NVRx's client imported unchanged (served by ours; NVRx's own
outside the rank bootstrap), and a real fork's inherited excepthook. The decisions
themselves (the rank blamed, the timeouts in force, classify agreeing with reason.json),
with the stories of Lightning's BoringModel, PyTorch's DDP tutorial and NCCL's error
raised through ``finally``, are in tests/fast/test_decisions.py; a real Lightning crash
and hang is in tests/integration/test_nvrx_examples.py.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.support import RANKS, Daemon

pytestmark = pytest.mark.torch

Start = Callable[..., Daemon]


def _decisions(d: Daemon) -> list[tuple[int, str, str, int | None, str | None]]:
    return [(e["generation"], e["action"], e["reason"], e["rank"], e["rule"]) for e in d.events("decision")]


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
    # the decisions on these timeouts (unmonitored, calculated at the floor, the hang and
    # its blame): tests/fast/test_decisions.py; here the shim's part in a torch rank
    assert d.events("timeouts_calculated")[0]["in_force"]["heartbeat"] == 2.0
    calc = r"calculated HeartbeatTimeouts\(initial=([\d.]+), subsequent=2.0, were_calculated=True\)"
    initial = re.search(calc, d.stdout())
    assert initial is not None and float(initial[1]) >= 2.0, d.stdout()
    assert _decisions(d) == [(0, "restart", "rank_hung", 1, "HANG")]
    # generation 1 loaded the calculated timeouts from the checkpoint and finished
    assert f"rank 1 generation 1 starts at epoch 1: HeartbeatTimeouts(initial={initial[1]}" in d.stdout()
    assert "rank 1 generation 1 done" in d.stdout()


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
    assert not d.events("nvrx_served")  # the decision's detail: tests/fast/test_decisions.py


def test_what_a_killed_ranks_forked_helper_says_after_its_death_decides_nothing(start: Start) -> None:
    # its helper dies of a real "Connection reset by peer" into the rank's log, and its
    # inherited excepthook reports it as the rank's: the rank's own SIGKILL decides
    d = start("--nproc-per-node", "2", "--max-restarts", "1", "--preload", "none",
              str(RANKS / "orphan_speaks.py"))  # fmt: skip
    assert d.wait(timeout=60) == 0, d.story()
    assert _decisions(d) == [(0, "restart", "rank_failed", 1, "X-SIGKILL")]
    # the helper's report is told apart by its pid (when it arrives before the generation ends)
    assert all(e["exc_type"] == "ConnectionResetError" for e in d.events("child_exception"))


