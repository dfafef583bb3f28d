"""Auto-resume: the finished-flag file stops a re-run; --autoresume creates it on completion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    assert d.wait() == 0, d.story()
    assert "already_finished" in d.stderr() and str(flag) in d.stderr()
    assert d.run_dir() is None  # no run at all: no ranks, no event log


def test_autoresume_marks_a_completed_run_and_ranks_see_the_flag(start: Start, tmp_path: Path) -> None:
    flag = tmp_path / "flags" / "finished"
    dump = tmp_path / "env"
    dump.mkdir()
    d = start(*FAST, "--autoresume", "--finished-flag-file", str(flag), ENVDUMP, str(dump), run_id="job9")
    assert d.wait() == 0, d.story()
    assert json.loads(flag.read_text())["run_id"] == "job9"
    assert d.events("finished_flag_written")[0]["path"] == str(flag)
    for r in (0, 1):
        env = json.loads((dump / f"rank{r}.json").read_text())["env"]
        assert env["FAULT_TOL_FINISHED_FLAG_FILE"] == str(flag)
    # the outer loop's next attempt does nothing
    again = start(*FAST, "--autoresume", "--finished-flag-file", str(flag), BEHAVE, "--exit", "1")
    assert again.wait() == 0, again.stderr()
    assert again.run_dir() is None


def test_without_a_flag_file_ranks_get_one_in_the_run_directory(start: Start, tmp_path: Path) -> None:
    # a rank's "training finished" (Lightning's autoresume=True) always has a place to go
    dump = tmp_path / "env"
    dump.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "FAULT_TOL_FINISHED_FLAG_FILE"}
    d = start(*FAST, ENVDUMP, str(dump), env=env)
    assert d.wait() == 0, d.story()
    run_dir = d.run_dir()
    assert run_dir is not None
    for r in (0, 1):
        rank_env = json.loads((dump / f"rank{r}.json").read_text())["env"]
        assert rank_env["FAULT_TOL_FINISHED_FLAG_FILE"] == str(run_dir / "finished")
    assert not d.events("finished_flag_written")  # the daemon itself writes none


def test_a_failed_run_leaves_no_flag(start: Start, tmp_path: Path) -> None:
    flag = tmp_path / "finished"
    env = {**os.environ, "FAULT_TOL_FINISHED_FLAG_FILE": str(flag)}  # as ft_launcher users set it
    d = start(*FAST, "--autoresume", BEHAVE, "--exit", "1", "--fail-rank", "1", env=env)
    assert d.wait() != 0
    assert not flag.exists()
    assert not d.events("finished_flag_written")


LOOP = Path(__file__).parents[2] / "scripts" / "schedulers" / "slurm-autoresume.sh"
ATTEMPT = """
import os, pathlib, sys
from supervisor import client
marker = pathlib.Path(sys.argv[1])
attempts = int(marker.read_text()) if marker.exists() else 0
marker.write_text(str(attempts + 1))
if attempts < int(sys.argv[2]):
    client.request("reschedule", "this node is bad")
    sys.exit(1)
"""


def _loop(tmp_path: Path, fail_first: int, max_failures: int) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(ATTEMPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        FAULT_TOL_FINISHED_FLAG_FILE=str(tmp_path / "finished"),
        MAX_FAILURES=str(max_failures),
        FT_SUPERVISOR=str(Path(sys.executable).parent / "ft-supervisor"),
    )
    return subprocess.run(
        ["bash", str(LOOP), "--preload", "none", "--log-dir", str(tmp_path / "logs"), str(script),
         str(tmp_path / "attempts"), str(fail_first)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip


def test_the_slurm_loop_resumes_until_training_is_finished(tmp_path: Path) -> None:
    r = _loop(tmp_path, fail_first=1, max_failures=3)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "attempts").read_text() == "2"
    assert (tmp_path / "finished").exists()
    assert "attempt failed (exit 200), 1 of 3; resuming" in r.stderr
    # and a third launch is refused by the flag, before any rank starts
    again = _loop(tmp_path, fail_first=0, max_failures=3)
    assert again.returncode == 0 and (tmp_path / "attempts").read_text() == "2"


def test_the_slurm_loop_gives_up_when_the_failure_budget_is_spent(tmp_path: Path) -> None:
    r = _loop(tmp_path, fail_first=9, max_failures=2)
    assert r.returncode == 200, r.stderr
    assert (tmp_path / "attempts").read_text() == "2"
    assert "the budget (2) is spent" in r.stderr
    assert not (tmp_path / "finished").exists()
