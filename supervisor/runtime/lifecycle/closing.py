"""What the daemon leaves when the run ends: the reason file, the finished flag
(``--autoresume``), and the ``run_finished`` event with the daemon's own costs."""

from __future__ import annotations

import logging
import resource

from supervisor.config.run import RunConfig
from supervisor.runtime.lifecycle import autoresume
from supervisor.runtime.lifecycle.judge import Judge
from supervisor.runtime.records import reason as outcome
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.records.rundir import RunDir

EXIT_SUCCESS = 0


def close_run(
    code: int,
    *,
    cfg: RunConfig,
    events: EventLog,
    rundir: RunDir,
    judge: Judge | None,  # None: the daemon failed before it could judge anything
    stopped: bool,
    generation: int | None,
    completed: bool,
    seconds: float,
) -> None:
    if judge is not None:
        _write_reason(code, cfg, events, rundir, judge, stopped=stopped, generation=generation)
    if code == EXIT_SUCCESS and completed and cfg.autoresume and cfg.finished_flag is not None:
        try:
            autoresume.mark_finished(cfg.finished_flag, cfg.run_id)
            events.emit("finished_flag_written", path=str(cfg.finished_flag))
        except OSError as exc:
            events.emit(
                "finished_flag_unwritable", logging.ERROR, path=str(cfg.finished_flag), error=str(exc)
            )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    events.emit(
        "run_finished",
        logging.INFO if code == EXIT_SUCCESS else logging.WARNING,
        exit_code=code,
        restarts_used=0 if judge is None else judge.budget.used,
        seconds=round(seconds, 3),
        daemon_max_rss_kb=usage.ru_maxrss,
        daemon_cpu_s=round(usage.ru_utime + usage.ru_stime, 3),
        run_dir=str(rundir.root),
    )
    events.publish = None
    events.close()


def _write_reason(
    code: int, cfg: RunConfig, events: EventLog, rundir: RunDir, judge: Judge, *, stopped: bool,
    generation: int | None,
) -> None:  # fmt: skip
    path = cfg.policy.reason_file or rundir.root / outcome.REASON_FILE
    content = judge.reason(code, stopped=stopped, generation=generation)
    try:
        outcome.write_reason(path, content)
    except OSError as exc:
        events.emit("reason_unwritable", logging.WARNING, path=str(path), error=str(exc))
        return
    events.emit("reason_written", path=str(path), outcome=content["outcome"], rule=content["rule"])
