"""Decisions on real training code nobody here wrote the way of (issue 11): what needs
the real code. NVRx's client imported unchanged (served by ours; NVRx's own outside the
rank bootstrap), and a real fork's inherited excepthook. The decisions themselves (the
rank blamed, the timeouts in force, classify agreeing with reason.json), with the stories
of Lightning's BoringModel, PyTorch's DDP tutorial, NVRx's null heartbeat timeouts and
NCCL's error raised through ``finally``, are in tests/fast/test_decisions.py. Real torch
ranks running NVRx's code, null timeouts calculated at once included (NVRx's heartbeats
example under its own configuration), and a real Lightning crash and hang are in
tests/integration/test_nvrx_examples.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib.metadata import version

import pytest

from tests.support import RANKS, Daemon

pytestmark = pytest.mark.torch

Start = Callable[..., Daemon]


def _decisions(d: Daemon) -> list[tuple[int, str, str, int | None, str | None]]:
    return [(e["generation"], e["action"], e["reason"], e["rank"], e["rule"]) for e in d.events("decision")]


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
