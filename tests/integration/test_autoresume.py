"""Auto-resume: the finished-flag file stops a re-run; --autoresume creates it on completion."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from tests.support import RANKS, Daemon

BEHAVE = str(RANKS / "behave.py")
ENVDUMP = str(RANKS / "envdump.py")
FAST = ("--nproc-per-node", "2", "--preload", "none")
Start = Callable[..., Daemon]


def test_a_finished_flag_stops_a_rerun_before_any_rank_starts(start: Start, tmp_path: Path) -> None:
    flag = tmp_path / "finished"
    flag.write_text("{}")
    d = start(*FAST, "--finished-flag-file", str(flag), BEHAVE, "--exit", "1")
    assert d.wait() == 0, d.stderr()
    assert "already_finished" in d.stderr() and str(flag) in d.stderr()
    assert d.run_dir() is None  # no run at all: no ranks, no event log


def test_autoresume_marks_a_completed_run_and_ranks_see_the_flag(start: Start, tmp_path: Path) -> None:
    flag = tmp_path / "flags" / "finished"
    dump = tmp_path / "env"
    dump.mkdir()
    d = start(*FAST, "--autoresume", "--finished-flag-file", str(flag), ENVDUMP, str(dump), run_id="job9")
    assert d.wait() == 0, d.stderr()
    assert json.loads(flag.read_text())["run_id"] == "job9"
    assert d.events("finished_flag_written")[0]["path"] == str(flag)
    for r in (0, 1):
        env = json.loads((dump / f"rank{r}.json").read_text())["env"]
        assert env["FAULT_TOL_FINISHED_FLAG_FILE"] == str(flag)
    # the outer loop's next attempt does nothing
    again = start(*FAST, "--autoresume", "--finished-flag-file", str(flag), BEHAVE, "--exit", "1")
    assert again.wait() == 0, again.stderr()
    assert again.run_dir() is None


def test_a_failed_run_leaves_no_flag(start: Start, tmp_path: Path) -> None:
    flag = tmp_path / "finished"
    env = {**os.environ, "FAULT_TOL_FINISHED_FLAG_FILE": str(flag)}  # as ft_launcher users set it
    d = start(*FAST, "--autoresume", BEHAVE, "--exit", "1", "--fail-rank", "1", env=env)
    assert d.wait() != 0
    assert not flag.exists()
    assert not d.events("finished_flag_written")
