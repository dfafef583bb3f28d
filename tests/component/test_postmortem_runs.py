"""``ft-supervisor classify RUN_DIR`` says what the daemon judged there: the
generation it decided on, the rank that failed or hung (not the standbys stopped
at the end), the decision replayed with the run's budget and history, and
"no failure" for a run that succeeded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from supervisor.runtime.lifecycle.launcher import STANDBY_SETTLE
from tests.support import RANKS, Daemon

Start = Callable[..., Daemon]
FAST = ("--nproc-per-node", "2", "--preload", "none")
BEHAVE = str(RANKS / "behave.py")
FAILS = str(RANKS / "fails.py")
MONITORED = str(RANKS / "monitored.py")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "classify", *args], capture_output=True, text=True, timeout=60
    )


def _json(*args: str) -> Any:
    r = _cli("--json", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def _run_dir(d: Daemon) -> Path:
    run_dir = d.run_dir()
    assert run_dir is not None
    return run_dir


def _reason(run_dir: Path) -> dict[str, Any]:
    reason: dict[str, Any] = json.loads((run_dir / "reason.json").read_text())
    return reason


def test_a_run_that_recovered_says_it_succeeded_and_what_it_recovered_from(
    start: Start, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    Path(f"{go}0").touch()
    d = start(*FAST, "--max-restarts", "2", BEHAVE, "--wait-for", str(go),
              "--fail-rank", "1", "--fail-generations", "0", "--kill-self", "SIGKILL")  # fmt: skip
    # generation 1 runs until generation 2's standbys are up (they wait for it to settle)
    d.wait_event("rank_spawned", where=lambda e: e["generation"] == 2, count=2, timeout=STANDBY_SETTLE + 30)
    Path(f"{go}1").touch()
    assert d.wait() == 0, d.story()
    # the next generation's standbys were stopped when the run ended: the latest
    # generation in rank_exited, though it never started
    assert max(e["generation"] for e in d.events("rank_exited")) == 2
    assert max(e["generation"] for e in d.events("generation_started")) == 1
    run_dir = _run_dir(d)
    text = _cli(str(run_dir)).stdout
    assert "no failure: the run succeeded" in text
    assert "decision: restart" not in text
    out = _json(str(run_dir))
    assert (out["outcome"], out["decision"], out["rule"]) == ("succeeded", None, None)
    recovered = _reason(run_dir)["last_failure"]
    mine = out["last_failure"]
    assert [mine[k] for k in ("generation", "rule", "rank", "action")] == [0, "X-SIGKILL", 1, "restart"]
    assert [recovered[k] for k in ("generation", "rule", "rank", "action")] == [0, "X-SIGKILL", 1, "restart"]


def test_a_hung_rank_is_classified_as_a_hang(start: Start) -> None:
    d = start(*FAST, "--max-restarts", "0", "--ft-rank-heartbeat-timeout", "0.5",
              MONITORED, "--heartbeat", "--hang-at", "5")  # fmt: skip
    assert d.wait() == 200, d.stderr()
    run_dir = _run_dir(d)
    out = _json(str(run_dir))
    reason = _reason(run_dir)
    c = out["classification"]
    assert (c["rule"], c["rank"]) == ("HANG", 1) == (reason["rule"], reason["rank"])
    assert out["decision"]["action"] == "reschedule" == reason["decision"]["action"]
    assert out["classification"]["lines"][0].startswith("hung: rank 1: no heartbeat for")


def test_the_decision_is_replayed_with_the_runs_budget_and_history(start: Start, tmp_path: Path) -> None:
    d = start(*FAST, "--max-restarts", "1", FAILS, "--exit", "3")
    assert d.wait() == 200, d.stderr()
    run_dir = _run_dir(d)
    out = _json(str(run_dir))
    assert (out["decision"]["action"], out["decision"]["reason"]) == ("reschedule", "restarts_exhausted")
    assert (out["classification"]["rule"], out["classification"]["rank"]) == ("unclassified", 1)
    assert [(e["generation"], e["action"], e["reason"]) for e in out["decisions"]] == [
        (0, "restart", "rank_failed"),
        (1, "reschedule", "restarts_exhausted"),
    ]
    assert _json("--check", str(run_dir))["agrees"] is True
    # --check says where the two part, with both sides
    tampered = tmp_path / "tampered"
    shutil.copytree(run_dir, tampered)
    reason = _reason(tampered)
    (tampered / "reason.json").write_text(json.dumps({**reason, "rule": "N1", "rank": 0}))
    r = _cli("--check", str(tampered))
    assert r.returncode == 1
    assert "disagrees with reason.json" in r.stdout
    assert "classify says rule='unclassified', rank=1" in r.stdout
    assert "the daemon said rule='N1', rank=0" in r.stdout


def test_a_run_ids_directory_judges_each_of_its_runs(start: Start, tmp_path: Path) -> None:
    shared = tmp_path / "shared-logs"
    first = start(*FAST, "--log-dir", str(shared), FAILS, "--exit", "3")
    assert first.wait() == 200, first.stderr()
    second = start(*FAST, "--log-dir", str(shared), BEHAVE)
    assert second.wait() == 0, second.stderr()
    out = _json(str(shared / "t"))
    assert [(r["outcome"], r["rule"], r["rank"]) for r in out["runs"]] == [
        ("reschedule", "unclassified", 1),
        ("succeeded", None, None),
    ]
