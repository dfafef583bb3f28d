"""What the daemon leaves for the scheduler and the people after it: the JSON
reason file, and OSMO-style per-rank error logs on a reschedule.

Both are written before the daemon exits, atomically (a reader never sees half
a file), and a failure to write them is reported, never fatal: the exit code
still carries the decision.

``reason.json`` in the run directory is the whole record. A ``--reason-file``
is a copy for a scheduler, bounded to :data:`REASON_FILE_LIMIT` bytes: Kubernetes
keeps the first 4096 bytes of ``/dev/termination-log``, and a JSON object cut
there is no longer JSON. :func:`bounded` shortens the copy field by field (the
evidence first, the outcome, exit code and decision never) so that it is always
whole JSON within the limit.
"""

from __future__ import annotations

import errno
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
# Kubernetes' termination message: the kubelet keeps the first 4096 bytes of the file
REASON_FILE_LIMIT = 4096
_CUT = 200  # a shortened string's length, in characters, before the marker
_MARK = "...[cut]"


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
        try:
            Path(tmp).replace(path)
        except OSError as exc:
            # a file bind-mounted into a container (Kubernetes' /dev/termination-log is
            # one) cannot be renamed over: EBUSY. Write it in place instead.
            if exc.errno not in (errno.EBUSY, errno.EXDEV):
                raise
            Path(tmp).unlink(missing_ok=True)
            path.write_bytes(data)
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


def _cut(value: Any, limit: int) -> Any:
    """Every string in ``value`` at most ``limit`` characters (plus the marker)."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + _MARK
    if isinstance(value, list):
        return [_cut(v, limit) for v in value]
    if isinstance(value, dict):
        return {k: _cut(v, limit) for k, v in value.items()}
    return value


def _cut_all(content: dict[str, Any], limit: int) -> dict[str, Any]:
    return {k: _cut(v, limit) for k, v in content.items()}


def _essentials(content: dict[str, Any]) -> dict[str, Any]:
    """What a scheduler acts on and a person reads first; nothing of unbounded length
    except the names, which the last step cuts."""
    decision = content.get("decision")
    root = content.get("root_cause")
    return {
        "outcome": content.get("outcome"),
        "exit_code": content.get("exit_code"),
        "run_id": content.get("run_id"),
        "node": content.get("node"),
        "generation": content.get("generation"),
        "restarts_used": content.get("restarts_used"),
        "max_restarts": content.get("max_restarts"),
        "decision": None if not isinstance(decision, dict)
        else {"action": decision.get("action"), "reason": decision.get("reason")},
        "rule": content.get("rule"),
        "rank": content.get("rank"),
        "root_cause": None
        if not isinstance(root, dict)
        else {"rank": root.get("rank"), "exit": root.get("exit")},
    }


def bounded(content: dict[str, Any], limit: int = REASON_FILE_LIMIT, full: Path | None = None) -> bytes:
    """The reason file's bytes, at most ``limit`` of them and always one whole JSON object.

    Under the limit it is ``content`` as :func:`write_reason` writes it. Over it, each
    step below is tried in turn, each on top of the last, until the JSON fits: the
    long strings (a rank's 100 KB log line) cut to 200 characters; the evidence
    lines to the first three; the list of failures, the classification and the
    unkillable ranks dropped (their count kept); only the essentials (outcome, exit
    code, run, node, generation, restarts, decision's action and reason, rule, rank,
    the root cause's rank and exit); those with every string cut to 32 characters.
    A shortened copy says ``"truncated": true`` and, given ``full``, where the whole
    record is (``"full"``)."""
    whole = orjson.dumps(content, option=orjson.OPT_INDENT_2) + b"\n"
    if len(whole) <= limit:
        return whole
    note: dict[str, Any] = {"truncated": True, "full": None if full is None else str(full)}

    def cut_strings(c: dict[str, Any]) -> dict[str, Any]:
        return _cut_all(c, _CUT)

    def fewer_lines(c: dict[str, Any]) -> dict[str, Any]:
        lines = c.get("evidence_lines") or []
        return {**c, "evidence_lines": lines[:3]}

    def drop_lists(c: dict[str, Any]) -> dict[str, Any]:
        bulky = ("failures", "classification", "unkillable", "last_failure")
        out = {k: v for k, v in c.items() if k not in bulky}
        out["failures_count"] = len(content.get("failures") or [])
        return out

    def essentials(c: dict[str, Any]) -> dict[str, Any]:
        return _cut_all(_essentials(c), _CUT)

    def tiny(c: dict[str, Any]) -> dict[str, Any]:
        return _cut_all(_essentials(c), 32)

    shortened = dict(content)
    for step in (cut_strings, fewer_lines, drop_lists, essentials, tiny):
        shortened = step(shortened)
        data = orjson.dumps({**shortened, **_cut_all(note, _CUT)}) + b"\n"
        if len(data) <= limit:
            return data
    # a limit too small even for the essentials: the outcome and the exit code alone
    return orjson.dumps({"outcome": _cut(content.get("outcome"), 32), "exit_code": content.get("exit_code"),
                         "truncated": True}) + b"\n"


def write_reason_bounded(path: Path, content: dict[str, Any], full: Path | None,
                         limit: int = REASON_FILE_LIMIT) -> None:  # fmt: skip
    write_atomically(path, bounded(content, limit, full))
