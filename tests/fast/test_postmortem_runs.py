"""``ft-supervisor classify RUN_DIR`` on the run directories a fast-tier run leaves: the
generation the daemon decided on, the rank that failed or hung (not the standbys
stopped at the end), the decision replayed with the run's budget and history, and
"no failure" for a run that succeeded. classify runs in-process, as the CLI would."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli import main
from supervisor.runtime.lifecycle.launcher import STANDBY_SETTLE
from tests.fast import vloop
from tests.fast.fakes import Rank
from tests.fast.harness import supervise

WATCHDOG = (
    "[rank1]:[E1122 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=37, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600045 milliseconds before timing out."
)


def classify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["classify", *args])
    return code, capsys.readouterr().out


def classify_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out = classify(capsys, "--json", *args)
    assert code == 0, out
    return json.loads(out)


def _reason(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "reason.json").read_text()))


def fails(code: int = 3, say: str | None = None):
    """tests/fixtures/ranks/fails.py: rank 1 says ``say`` and exits ``code``; rank 0 waits."""

    async def script(r: Rank) -> int | None:
        r.hello()
        if r.rank != 1:
            await r.hang()
        if say is not None:
            r.log(say)
        return code

    return script


def test_a_run_that_recovered_says_it_succeeded_and_what_it_recovered_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def behave(r: Rank) -> int | None:
        r.hello()
        if r.generation == 0 and r.rank == 1:
            return -signal.SIGKILL
        if r.generation == 0:
            await r.hang()
        # generation 1 runs until generation 2's standbys are up (they wait for it to settle)
        await r.sleep(STANDBY_SETTLE + 1)
        return 0

    run = supervise(tmp_path, behave, "--max-restarts", "2")
    assert run.code == 0, run.story()
    # the next generation's standbys were stopped when the run ended: the latest
    # generation in rank_exited, though it never started
    assert max(e["generation"] for e in run.named("rank_exited")) == 2
    assert max(e["generation"] for e in run.named("generation_started")) == 1
    text = classify(capsys, str(run.rundir))[1]
    assert "no failure: the run succeeded" in text
    assert "decision: restart" not in text
    out = classify_json(capsys, str(run.rundir))
    assert (out["outcome"], out["decision"], out["rule"]) == ("succeeded", None, None)
    keys = ("generation", "rule", "rank", "action")
    assert [out["last_failure"][k] for k in keys] == [0, "X-SIGKILL", 1, "restart"]
    assert [_reason(run.rundir)["last_failure"][k] for k in keys] == [0, "X-SIGKILL", 1, "restart"]


def test_a_hung_rank_is_classified_as_a_hang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def hangs_at_5(r: Rank) -> int | None:  # tests/fixtures/ranks/monitored.py --heartbeat --hang-at 5
        r.hello()
        for step in range(20):
            if step == 5 and r.rank == 1:
                await r.hang()
            r.heartbeat()
            await r.sleep(0.01)
        return 0

    run = supervise(tmp_path, hangs_at_5, "--max-restarts", "0", "--ft-rank-heartbeat-timeout", "0.5")
    assert run.code == 200, run.story()
    out = classify_json(capsys, str(run.rundir))
    reason = _reason(run.rundir)
    c = out["classification"]
    assert (c["rule"], c["rank"]) == ("HANG", 1) == (reason["rule"], reason["rank"])
    assert out["decision"]["action"] == "reschedule" == reason["decision"]["action"]
    assert c["lines"][0].startswith("hung: rank 1: no heartbeat for")


def test_the_decision_is_replayed_with_the_runs_budget_and_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = supervise(tmp_path, fails(3), "--max-restarts", "1")
    assert run.code == 200, run.story()
    out = classify_json(capsys, str(run.rundir))
    assert (out["decision"]["action"], out["decision"]["reason"]) == ("reschedule", "restarts_exhausted")
    assert (out["classification"]["rule"], out["classification"]["rank"]) == ("unclassified", 1)
    assert [(e["generation"], e["action"], e["reason"]) for e in out["decisions"]] == [
        (0, "restart", "rank_failed"),
        (1, "reschedule", "restarts_exhausted"),
    ]
    assert classify_json(capsys, "--check", str(run.rundir))["agrees"] is True
    # --check says where the two part, with both sides
    tampered = tmp_path / "tampered"
    shutil.copytree(run.rundir, tampered)
    reason = _reason(tampered)
    (tampered / "reason.json").write_text(json.dumps({**reason, "rule": "N1", "rank": 0}))
    code, text = classify(capsys, "--check", str(tampered))
    assert code == 1
    assert "disagrees with reason.json" in text
    assert "classify says rule='unclassified', rank=1" in text
    assert "the daemon said rule='N1', rank=0" in text


def test_a_run_ids_directory_judges_each_of_its_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared-logs"

    async def behave(r: Rank) -> int | None:
        r.hello()
        return 0

    first = supervise(tmp_path / "a", fails(3), "--log-dir", str(shared), "--rdzv-id", "t")
    assert first.code == 200, first.story()
    monkeypatch.setattr(vloop, "START", vloop.START + 3600)  # the second attempt, an hour later
    second = supervise(tmp_path / "b", behave, "--log-dir", str(shared), "--rdzv-id", "t")
    assert second.code == 0, second.story()
    out = classify_json(capsys, str(shared / "t"))
    assert [(r["outcome"], r["rule"], r["rank"]) for r in out["runs"]] == [
        ("reschedule", "unclassified", 1),
        ("succeeded", None, None),
    ]


def test_classify_a_run_directory_the_daemon_left(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = supervise(tmp_path, fails(1, say=WATCHDOG))
    out = classify_json(capsys, str(run.rundir))
    assert (out["classification"]["rule"], out["classification"]["rank"]) == ("N1", 1)
    # the same answer the daemon gave
    assert run.named("decision")[0]["rule"] == "N1"
