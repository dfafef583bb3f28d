"""What the daemon leaves for the scheduler and the people after it: the JSON
reason file, and OSMO-style per-rank error logs on a reschedule.

Both are written before the daemon exits, atomically (a reader never sees half
a file), and a failure to write them is reported, never fatal: the exit code
still carries the decision.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import orjson

from supervisor.clock import SYSTEM
from supervisor.core.classify import Classification
from supervisor.core.evidence import Evidence
from supervisor.core.types import Action, Decision, RankFailure

REASON_FILE = "reason.json"


def _rank(failure: RankFailure) -> dict[str, Any]:
    return {
        "rank": failure.exit.rank,
        "local_rank": failure.exit.local_rank,
        "pid": failure.exit.pid,
        "exit": failure.exit.status.describe(),
        "failed_at": failure.failed_at,
        "summary": failure.summary(),
    }


def reason(
    *,
    exit_code: int,
    outcome: str,
    run_id: str,
    node: str,
    generation: int | None,
    restarts_used: int,
    max_restarts: int,
    evidence: Evidence | None,
    classification: Classification | None,
    decision: Decision | None,
) -> dict[str, Any]:
    """The reason file's content: one JSON object, the same names as the events."""
    root = evidence.failures[0] if evidence is not None and evidence.failures else None
    c = classification
    return {
        "outcome": outcome,  # succeeded | continue | reschedule | abort | stopped | failed
        "exit_code": exit_code,
        "run_id": run_id,
        "node": node,
        "generation": generation,
        "restarts_used": restarts_used,
        "max_restarts": max_restarts,
        "t_wall": SYSTEM.wall(),
        "decision": None
        if decision is None
        else {"action": str(decision.action), "reason": str(decision.reason), "detail": decision.detail},
        "rule": None if c is None else c.rule,
        "classification": None if c is None else c.to_json(),
        "rank": None if c is None else c.rank,
        "root_cause": None if root is None else _rank(root),
        "evidence_lines": [] if c is None else list(c.lines),
        "failures": [] if evidence is None else [_rank(f) for f in evidence.failures],
        "unkillable": [] if evidence is None else list(evidence.unkillable),
    }


def write_atomically(path: Path, data: bytes) -> None:
    if path.exists() and not path.is_file():
        # a device or a pipe (Kubernetes' /dev/termination-log): no temporary beside it
        path.write_bytes(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_reason(path: Path, content: dict[str, Any]) -> None:
    write_atomically(path, orjson.dumps(content, option=orjson.OPT_INDENT_2) + b"\n")


def error_logs(
    prefix: str, evidence: Evidence, classification: Classification | None, decision: Decision
) -> list[Path]:
    """OSMO's cookbook: each failed rank appends "Training error occurred: ..." to
    PREFIX.rank_<rank>; its launch script reschedules when such files exist. Only
    for a reschedule, as the cookbook only writes them for reschedulable errors."""
    if decision.action is not Action.RESCHEDULE:
        return []
    written = []
    for failure in evidence.failures or ():
        path = Path(f"{prefix}.rank_{failure.exit.rank}")
        lines = [f"Training error occurred: {failure.summary()}"]
        if classification is not None and classification.rank == failure.exit.rank:
            lines += [f"  rule {classification.rule}: {line}" for line in classification.lines]
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write("\n".join(lines) + "\n")
        written.append(path)
    return written
