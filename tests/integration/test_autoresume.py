"""Auto-resume with a real outer loop: the SLURM script around the console script's exit
codes and the finished-flag file. The flag itself (refused re-runs, written on success only,
the ranks' environment) is tests/fast/test_startup.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
