"""``--reason-file`` never writes more than 4096 bytes (Kubernetes keeps the first 4096
of /dev/termination-log), and what it writes is always one whole JSON object with the
outcome, the exit code and the decision in it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.classify import Classification
from supervisor.core.evidence import Evidence
from supervisor.core.types import Action, Decision, ErrorRecord, ExitStatus, RankExit, RankFailure, Reason
from supervisor.runtime.records import reason as outcome

LIMIT = outcome.REASON_FILE_LIMIT
HUGE = "RuntimeError: " + "x" * 100_000  # a rank's 100 KB error line


def _failure(rank: int, message: str, tail: tuple[str, ...] = ()) -> RankFailure:
    exit_ = RankExit(local_rank=rank, rank=rank, pid=1000 + rank, status=ExitStatus(code=1), at=1.0,
                     at_wall=1_700_000_000.0)  # fmt: skip
    return RankFailure(exit=exit_, error=ErrorRecord(message=message, traceback=message), log_tail=tail)


def _content(message: str = HUGE, ranks: int = 8, **extra: Any) -> dict[str, Any]:
    failures = tuple(_failure(r, message, (message, message)) for r in range(ranks))
    c = Classification("U1", "user_code", "deterministic", Action.ABORT, rank=0, lines=(message,) * 5,
                       summary=message)  # fmt: skip
    content = outcome.reason(
        exit_code=2, outcome="abort", run_id="job42", node="node-7", generation=3, restarts_used=1,
        max_restarts=3, evidence=Evidence(failures=failures, unkillable=(1, 2)), classification=c,
        decision=Decision(Action.ABORT, Reason.RANK_FAILED, detail=message),
    )  # fmt: skip
    return {**content, **extra}


def _essentials_kept(data: bytes) -> dict[str, Any]:
    assert len(data) <= LIMIT, len(data)
    cut = json.loads(data)
    assert (cut["outcome"], cut["exit_code"], cut["decision"]["action"]) == ("abort", 2, "abort")
    assert (cut["decision"]["reason"], cut["rule"], cut["rank"], cut["node"]) == (
        "rank_failed", "U1", 0, "node-7")  # fmt: skip
    return cut


def test_a_100_kb_failure_text_is_cut_to_whole_json_under_4_kib() -> None:
    content = _content()
    whole = outcome.bounded(content, limit=10**9)
    assert len(whole) > 1_000_000  # eight ranks' 100 KB texts, several times each
    cut = _essentials_kept(outcome.bounded(content, full=Path("/logs/job42/run/reason.json")))
    assert cut["truncated"] is True and cut["full"] == "/logs/job42/run/reason.json"
    assert cut["generation"] == 3 and cut["root_cause"]["rank"] == 0


def test_the_first_steps_keep_as_much_as_fits() -> None:
    # one rank, a 5 KB message: cutting the long strings is enough, the evidence stays
    cut = _essentials_kept(outcome.bounded(_content("E" * 5_000, ranks=1)))
    assert cut["truncated"] is True
    assert cut["evidence_lines"] and cut["evidence_lines"][0].endswith("...[cut]")
    assert cut["classification"]["category"] == "user_code"
    assert len(cut["failures"]) == 1


def test_a_reason_under_the_limit_is_written_whole() -> None:
    content = _content("ValueError: bad learning rate", ranks=2)
    data = outcome.bounded(content)
    assert data == outcome.bounded(content, limit=10**9)
    assert "truncated" not in json.loads(data) and json.loads(data) == json.loads(json.dumps(content))


@settings(max_examples=60, deadline=None)
@given(
    message=st.text(min_size=0, max_size=20_000),
    ranks=st.integers(min_value=0, max_value=40),
    node=st.text(min_size=1, max_size=6_000),
)
def test_any_content_fits_as_json(message: str, ranks: int, node: str) -> None:
    data = outcome.bounded({**_content(message, ranks=ranks), "node": node}, full=Path("/x/reason.json"))
    assert len(data) <= LIMIT
    cut = json.loads(data)
    assert (cut["outcome"], cut["exit_code"]) == ("abort", 2)


def test_the_bounded_copy_is_what_lands_in_the_file(tmp_path: Path) -> None:
    target = tmp_path / "termination-log"
    outcome.write_reason_bounded(target, _content(), full=tmp_path / "reason.json")
    _essentials_kept(target.read_bytes())


def _bind_mount_refused(tmp: Path) -> str | None:
    if os.geteuid() != 0:
        return "needs root for mount --bind"
    src, dst = tmp / "src", tmp / "dst"
    src.touch()
    dst.touch()
    r = subprocess.run(["mount", "--bind", str(src), str(dst)], capture_output=True, text=True, timeout=10)
    return None if r.returncode == 0 else f"mount --bind refused: {r.stderr.strip()}"


def test_a_bind_mounted_termination_log_is_written_in_place(tmp_path: Path) -> None:
    """The kubelet bind-mounts /dev/termination-log into the container: renaming a
    temporary over it fails with EBUSY, so the file is written in place."""
    refused = _bind_mount_refused(tmp_path)
    if refused is not None:
        pytest.skip(refused)
    try:
        outcome.write_reason_bounded(tmp_path / "dst", _content(), full=None)
        assert _essentials_kept((tmp_path / "src").read_bytes())["truncated"] is True  # through the mount
    finally:
        subprocess.run(["umount", str(tmp_path / "dst")], check=True, timeout=10)
