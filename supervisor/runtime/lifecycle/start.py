"""The daemon's entry point: the process's limits, its log, its event loop, then the
Supervisor until the run ends. Whatever escapes is the daemon's own failure (exit 1)."""

from __future__ import annotations

import asyncio
import logging
import os
import resource

from supervisor import log
from supervisor.clock import SYSTEM
from supervisor.config.run import RunConfig
from supervisor.core.topology import ENV_NOFILE
from supervisor.runtime.lifecycle import autoresume
from supervisor.runtime.lifecycle.daemon import EXIT_FAILED, EXIT_SUCCESS, EXIT_USAGE, Supervisor
from supervisor.runtime.lifecycle.processes import Processes
from supervisor.runtime.records.rundir import RunDir


def _loop_factory() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


MAX_DESCRIPTORS = 4096  # the daemon's own open files: what bounds the connections it holds


def _bound_descriptors() -> None:
    """Every connection to an endpoint holds a descriptor and a few KiB: cap them by capping
    the daemon's open files. Ranks get the original limit back (process/bootstrap.py)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft <= MAX_DESCRIPTORS:
        return
    os.environ[ENV_NOFILE] = str(soft)
    resource.setrlimit(resource.RLIMIT_NOFILE, (MAX_DESCRIPTORS, hard))


def run_daemon(config: RunConfig) -> int:
    _bound_descriptors()
    console = log.Console(json_lines=config.log_format == "json")
    console.start()
    logger = log.setup(console, config.log_level)
    try:
        flag = config.finished_flag
        if flag is not None and flag.exists():
            logger.info("already_finished", extra={"fields": {"finished_flag": str(flag), "exit_code": 0}})
            return EXIT_SUCCESS  # an auto-resume loop relaunched a run whose training is complete
        try:
            rundir = RunDir.create(config.log_dir, config.run_id, os.getpid(), SYSTEM.wall())
        except OSError as exc:
            logger.error("cannot create the run directory under %s: %s", config.log_dir, exc)  # noqa: TRY400
            return EXIT_USAGE
        autoresume.export(flag, rundir.root)
        with asyncio.Runner(loop_factory=_loop_factory) as runner:
            return runner.run(_supervise(config, rundir, logger, console))
    except Exception:
        logger.exception("internal_error")
        return EXIT_FAILED
    finally:
        console.close()


async def _supervise(config: RunConfig, rundir: RunDir, logger: logging.Logger, console: log.Console) -> int:
    # built inside the running loop: its collaborators bind sockets and make tasks' events.
    # The seams, filled here for the field (the fast tier fills them with virtual time and
    # fake ranks): the system's clock, the node's real processes; the job (the other
    # nodes) is built by the daemon from --rdzv-*, as its store reports through the event log
    return await Supervisor(config, rundir, logger, console, clock=SYSTEM, processes=Processes()).run()
