"""What the daemon leaves when the run ends: the decision told to the operator (and
OSMO's error logs), the reason file, the finished flag (``--autoresume``), and the
``run_finished`` event with the daemon's own costs."""

from __future__ import annotations

import logging
import resource
from pathlib import Path
from typing import Any

from supervisor.config.run import RunConfig
from supervisor.core.catalogue.daemon import (
    FinishedFlagUnwritable,
    FinishedFlagWritten,
    ReasonUnwritable,
    ReasonWritten,
    RunFinished,
)
from supervisor.core.catalogue.generation import ErrorLogsUnwritable, ErrorLogsWritten
from supervisor.core.types import Action
from supervisor.runtime.lifecycle import autoresume
from supervisor.runtime.lifecycle.deciding import Judgement
from supervisor.runtime.records import reason as outcome
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.records.failure_text import render_failure
from supervisor.runtime.records.rundir import RunDir

EXIT_SUCCESS = 0


def close_run(
    code: int,
    *,
    cfg: RunConfig,
    events: EventLog,
    rundir: RunDir,
    judgement: Judgement | None,  # the last decision on this node, if any
    node: str,
    restarts_used: int,
    stopped: bool,
    generation: int | None,
    completed: bool,
    seconds: float,
) -> None:
    content = reason(code, cfg, judgement, node=node, restarts_used=restarts_used, stopped=stopped,
                     generation=generation)  # fmt: skip
    _write_reason(content, cfg, events, rundir)
    if code == EXIT_SUCCESS and completed and cfg.autoresume and cfg.finished_flag is not None:
        try:
            autoresume.mark_finished(cfg.finished_flag, cfg.run_id)
            events.emit(FinishedFlagWritten(path=str(cfg.finished_flag)))
        except OSError as exc:
            events.emit(FinishedFlagUnwritable(path=str(cfg.finished_flag), error=str(exc)))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    events.emit(
        RunFinished(
            exit_code=code,
            restarts_used=restarts_used,
            seconds=round(seconds, 3),
            daemon_max_rss_kb=usage.ru_maxrss,
            daemon_cpu_s=round(usage.ru_utime + usage.ru_stime, 3),
            run_dir=str(rundir.root),
        ),
        logging.INFO if code == EXIT_SUCCESS else logging.WARNING,
    )
    events.publish = None
    events.close()


def tell(
    judgement: Judgement, cfg: RunConfig, events: EventLog, logger: logging.Logger, run_dir: Path
) -> None:
    """The run ends on this judgement: tell the operator, and OSMO's launch script."""
    evidence, c, decision = judgement.evidence, judgement.classification, judgement.decision
    if decision.action in (Action.ABORT, Action.RESCHEDULE):
        logger.error("%s", render_failure(evidence, c, decision, run_dir))
    prefix = cfg.policy.error_log_prefix
    if not prefix:
        return
    try:
        written = outcome.error_logs(prefix, evidence, c, decision)
    except OSError as exc:
        events.emit(ErrorLogsUnwritable(prefix=prefix, error=str(exc)))
        return
    if written:
        events.emit(ErrorLogsWritten(files=[str(p) for p in written]))


def reason(
    code: int, cfg: RunConfig, judgement: Judgement | None, *, node: str, restarts_used: int, stopped: bool,
    generation: int | None,
) -> dict[str, Any]:  # fmt: skip
    """``reason.json``: how the run ended on this node, and on what decision."""
    decision = None if judgement is None else judgement.decision
    if stopped:
        result = "stopped"
    elif code == 0:
        result = "succeeded" if decision is None or decision.action is not Action.CONTINUE else "continue"
    elif decision is not None and decision.action is not Action.RESTART:
        result = str(decision.action)
    else:
        result = "failed"
    ended_by_failure = result not in ("succeeded", "continue", "stopped")
    evidence = None if judgement is None else judgement.evidence
    c = None if judgement is None else judgement.classification
    content = outcome.reason(
        exit_code=code,
        outcome=result,
        run_id=cfg.run_id,
        node=node,
        generation=generation,
        restarts_used=restarts_used,
        max_restarts=cfg.max_restarts,
        evidence=evidence if ended_by_failure else None,
        classification=c if ended_by_failure else None,
        decision=decision if ended_by_failure or result == "continue" else None,
    )
    bundle = None if judgement is None or judgement.bundle is None else str(judgement.bundle)
    if ended_by_failure:
        content["bundle"] = bundle  # the hang's diagnostic bundle, when it was a hang
    if judgement is not None and judgement.job_blame is not None:
        # a job-wide hang's one blame, the same on every node: {rule, ranks, nodes, detail, mismatch?}
        content["job_blame"] = judgement.job_blame
    if not ended_by_failure and c is not None and decision is not None:
        # the run went on after it: history, not the reason the run ended
        content["last_failure"] = {
            "generation": None if evidence is None else evidence.generation,
            "rule": c.rule,
            "rank": c.rank,
            "action": str(decision.action),
            "detail": decision.detail,
            "bundle": bundle,
        }
    return content


def _write_reason(content: dict[str, Any], cfg: RunConfig, events: EventLog, rundir: RunDir) -> None:
    """The whole record in the run directory; a ``--reason-file`` gets a copy bounded to
    4096 bytes (Kubernetes' termination message), still whole JSON."""
    full = rundir.root / outcome.REASON_FILE
    targets: list[tuple[Path, Path | None]] = [(full, None)]
    if cfg.policy.reason_file is not None and cfg.policy.reason_file != full:
        targets.append((cfg.policy.reason_file, full))
    for path, whole in targets:
        try:
            if whole is None:
                outcome.write_reason(path, content)
            else:
                outcome.write_reason_bounded(path, content, full=whole)
        except OSError as exc:
            events.emit(ReasonUnwritable(path=str(path), error=str(exc)))
            continue
        events.emit(ReasonWritten(path=str(path), outcome=content["outcome"], rule=content["rule"]))
