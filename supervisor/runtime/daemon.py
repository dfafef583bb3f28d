"""The daemon: launch generations, watch them, end them, decide, repeat.

The loop gathers evidence (exits, error files, log tails) and applies the
decisions that ``supervisor.core.policy.decide`` returns. Signals arrive as
commands on a queue. Every rank, whatever the reason, is ended by the one
termination procedure in ``supervisor.process.terminate``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import secrets
import signal
import time
from collections.abc import Awaitable, Coroutine
from typing import Any

from supervisor import log
from supervisor.config import RunConfig
from supervisor.core.errorfile import order_failures
from supervisor.core.policy import Budget, GenerationEnd, decide
from supervisor.core.states import GroupVerdict, RankState
from supervisor.core.topology import RunIdentity, master_env, rank_env, token_entry
from supervisor.core.types import Action, RankFailure, signal_name
from supervisor.process.evidence import failure_evidence
from supervisor.process.orphans import OrphanGuard, sweep_generation
from supervisor.process.ports import free_port
from supervisor.process.spawn import spawn_rank
from supervisor.process.tail import LogFollower
from supervisor.process.terminate import Signaller, TerminationReport, terminate
from supervisor.runtime import signals
from supervisor.runtime.clock import Clock
from supervisor.runtime.events import EventLog
from supervisor.runtime.generation import Generation
from supervisor.runtime.report import render_failure
from supervisor.runtime.rundir import RunDir

EXIT_SUCCESS = 0
EXIT_FAILED = 1  # torchrun's code for a failed run; classification refines it later
EXIT_USAGE = 2
TAIL_INTERVAL = 0.05


class Supervisor:
    def __init__(
        self,
        config: RunConfig,
        rundir: RunDir,
        logger: logging.Logger,
        console: log.Console,
        signaller: Signaller | None = None,
    ) -> None:
        self.cfg = config
        self.rundir = rundir
        self.logger = logger
        self.clock = Clock()
        self.token = secrets.token_hex(16)
        self._signaller = signaller or Signaller()
        self._commands: asyncio.Queue[signals.Command] = asyncio.Queue()
        self._follower = LogFollower(console)
        self._stop_signal: int | None = None
        self._stopping = asyncio.Event()
        self._force = asyncio.Event()
        self._current: Generation | None = None
        self._budget = Budget(config.max_restarts)
        self._started_at = self.clock.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> int:
        rundir = self.rundir
        self.events = EventLog(rundir.events, self.logger, self.clock, run_id=self.cfg.run_id)
        self.ident = RunIdentity(
            run_id=self.cfg.run_id,
            max_restarts=self.cfg.max_restarts,
            signals_to_handle=self.cfg.signals_to_handle,
            run_dir=str(rundir.root),
            run_token=self.token,
            virtual_local_rank=self.cfg.virtual_local_rank,
        )
        guard = await OrphanGuard.start(token_entry(self.token))
        handled = signals.install(self._commands, self.cfg.stop_signals)
        self.events.emit(
            "run_started",
            run_dir=str(rundir.root),
            pid=os.getpid(),
            nproc_per_node=self.cfg.topology.nproc_per_node,
            max_restarts=self.cfg.max_restarts,
            program=self.cfg.program.target,
            standby=self.cfg.standby,
            preload=",".join(self.cfg.program.preload) or None,
        )
        code = EXIT_FAILED
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                background = [tg.create_task(self._dispatch()), tg.create_task(self._tail())]
                try:
                    code = await self._supervise()
                finally:
                    # watchers of ranks that outlived SIGKILL would wait forever
                    for task in [*background, *self._tasks]:
                        task.cancel()
        finally:
            signals.uninstall(handled)
            await guard.close()
            self._finish(code)
        return code

    # -- the loop -----------------------------------------------------------------

    async def _supervise(self) -> int:
        gen = await self._prepare(0, standby=False)
        while True:
            await self._launch(gen)
            upcoming = self._tg.create_task(self._prepare_standby(gen))
            await self._wait_end(gen)
            report = await self._end(gen)
            if self._stop_signal is not None:
                await self._discard(upcoming)
                return 128 + self._stop_signal
            if gen.verdict is GroupVerdict.SUCCEEDED:
                await self._discard(upcoming)
                return EXIT_SUCCESS
            failures = await self._evidence(gen)
            end = GenerationEnd(tuple(failures), report.unkillable)
            decision = decide(end, self._budget, self.clock.monotonic())
            self.events.emit(
                "decision",
                logging.WARNING,
                generation=gen.number,
                action=str(decision.action),
                reason=str(decision.reason),
                detail=decision.detail,
            )
            if decision.action is not Action.RESTART:
                await self._discard(upcoming)
                self.logger.error("%s", render_failure(end, decision, self.rundir.root))
                return EXIT_FAILED
            self._budget = self._budget.spend()
            standby = await upcoming
            gen = standby or await self._prepare(gen.number + 1, standby=False)

    async def _prepare(self, number: int, *, standby: bool) -> Generation:
        gen = Generation(number, self.clock, self.events, self._follower.poll)
        for slot in self.cfg.topology.slots():
            await self._spawn_into(gen, slot.local_rank, standby=standby)
        return gen

    async def _spawn_into(self, gen: Generation, local_rank: int, *, standby: bool) -> None:
        slot = self.cfg.topology.slots()[local_rank]
        files = self.rundir.rank_files(gen.number, local_rank)
        env = rank_env(
            os.environ,
            self.cfg.topology,
            slot,
            self.ident,
            generation=gen.number,
            error_file=str(files.error_file),
        )
        rank = await spawn_rank(
            self.cfg.program, slot, env, files, now=self.clock.monotonic(), standby=standby
        )
        gen.add(rank)
        self._start_task(gen.watch(rank), f"watch-gen{gen.number}-rank{local_rank}")
        self.events.emit(
            "rank_spawned",
            logging.DEBUG,
            generation=gen.number,
            rank=slot.rank,
            local_rank=local_rank,
            pid=rank.pid,
            standby=standby,
        )

    async def _prepare_standby(self, current: Generation) -> Generation | None:
        """Spawn the next generation's ranks once the current ones have preloaded.

        Waiting for them keeps two generations from importing torch at once.
        """
        if not self.cfg.standby or self._budget.remaining == 0:
            return None
        ready = asyncio.gather(*(r.ready() for r in current.ranks.values()))
        if await _first(ready, current.ended.wait(), self._stopping.wait()) is not ready:
            return None
        if not all(ready.result()) or current.ended.is_set():
            return None
        return await self._prepare(current.number + 1, standby=True)

    async def _launch(self, gen: Generation) -> None:
        for lr, rank in list(gen.ranks.items()):
            if rank.state is RankState.FAILED:  # a standby that died while waiting
                await self._spawn_into(gen, lr, standby=False)
        port = self.cfg.master_port or free_port()
        late = master_env(self.cfg.master_addr, port)
        standby = [lr for lr, r in gen.ranks.items() if r.state is RankState.STANDBY]
        self.events.emit(
            "generation_started",
            generation=gen.number,
            master_addr=self.cfg.master_addr,
            master_port=port,
            standby_ranks=len(standby),
        )
        for rank in gen.ranks.values():
            if rank.state is RankState.STANDBY:
                rank.move_to(RankState.RUNNING)
            rank.go(late)
        self._current = gen
        for lr, rank in gen.ranks.items():
            for stream in self.cfg.console_streams(lr):
                path = rank.files.stdout if stream == log.STDOUT else rank.files.stderr
                self._follower.follow(rank.slot.rank, path, stream)
        gen.start()

    async def _wait_end(self, gen: Generation) -> None:
        await _first(gen.ended.wait(), self._stopping.wait())

    async def _end(self, gen: Generation) -> TerminationReport:
        stop_signal: int = signal.SIGTERM
        if self._stop_signal is not None:
            stop_signal = signals.forwarded(self._stop_signal)
        entry = token_entry(self.token, gen.number)
        gen.stop_wall = self.clock.wall()
        report = await terminate(
            list(gen.ranks.values()),
            grace=self.cfg.shutdown_timeout,
            kill_timeout=self.cfg.kill_timeout,
            force=self._force,
            stop_signal=stop_signal,
            sweep=lambda: sweep_generation(entry),
            signals=self._signaller,
        )
        self._follower.finish()
        if report.unkillable:
            self.events.emit(
                "rank_unkillable",
                logging.ERROR,
                generation=gen.number,
                local_ranks=list(report.unkillable),
                pids=[gen.ranks[lr].pid for lr in report.unkillable],
                kill_timeout=self.cfg.kill_timeout,
            )
        self.events.emit(
            "generation_ended",
            generation=gen.number,
            verdict=str(gen.verdict),
            signalled=len(report.signalled),
            killed=len(report.killed),
            swept=report.swept or None,
            seconds=round(report.seconds, 3),
        )
        return report

    async def _discard(self, upcoming: asyncio.Task[Generation | None]) -> None:
        """Stop standby ranks that will never get their go, and forget their files."""
        gen = await upcoming
        if gen is None:
            return
        for rank in gen.ranks.values():
            rank.close_boot()
        await terminate(
            list(gen.ranks.values()),
            grace=self.cfg.shutdown_timeout,
            kill_timeout=self.cfg.kill_timeout,
            force=self._force,
            signals=self._signaller,
        )
        self.rundir.forget_generation(gen.number)

    async def _evidence(self, gen: Generation) -> list[RankFailure]:
        """Every rank that failed on its own, the root cause first.

        That includes ranks we stopped: one may have raised (and written its
        error file) first, then been slow to exit while a peer failed because
        of it. Its error file, written before we signalled it, gives it away.
        """
        failures = []
        for lr, exit in gen.exits.items():
            state = gen.ranks[lr].state
            if state not in (RankState.FAILED, RankState.STOPPED):
                continue
            failure = await failure_evidence(exit, gen.ranks[lr].files)
            failed_first = failure.error_at is not None and (
                gen.stop_wall is None or failure.error_at < gen.stop_wall
            )
            if state is RankState.FAILED or failed_first:
                failures.append(failure)
        return order_failures(failures)

    # -- background tasks -----------------------------------------------------------

    async def _dispatch(self) -> None:
        while True:
            command = await self._commands.get()
            if isinstance(command, signals.Stop):
                self._on_stop(command.signum)
            else:
                self._dump_status()

    def _on_stop(self, signum: int) -> None:
        if self._stop_signal is None:
            self._stop_signal = signum
            self.events.emit("stop_requested", signal=signal_name(signum))
            self._stopping.set()
        elif signum == signal.SIGINT and not self._force.is_set():
            self.events.emit("stop_forced", signal=signal_name(signum))
            self._force.set()

    def _dump_status(self) -> None:
        gen = self._current
        self.events.emit(
            "status",
            generation=None if gen is None else gen.number,
            uptime_s=round(self.clock.monotonic() - self._started_at, 3),
            restarts_used=self._budget.used,
            max_restarts=self._budget.max_restarts,
            ranks=[]
            if gen is None
            else [
                {"rank": r.slot.rank, "local_rank": lr, "pid": r.pid, "state": str(r.state)}
                for lr, r in gen.ranks.items()
            ],
        )

    async def _tail(self) -> None:
        while True:
            self._follower.poll()
            await asyncio.sleep(TAIL_INTERVAL)

    def _start_task(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = self._tg.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _finish(self, code: int) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.events.emit(
            "run_finished",
            logging.INFO if code == EXIT_SUCCESS else logging.WARNING,
            exit_code=code,
            restarts_used=self._budget.used,
            seconds=round(self.clock.monotonic() - self._started_at, 3),
            daemon_max_rss_kb=usage.ru_maxrss,
            daemon_cpu_s=round(usage.ru_utime + usage.ru_stime, 3),
            run_dir=str(self.rundir.root),
        )
        self.events.close()


async def _first(*aws: Awaitable[Any]) -> asyncio.Future[Any]:
    """Wait for the first of ``aws`` to finish; cancel the others; return it."""
    futures = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in futures:
            if not f.done():
                f.cancel()
    return next(f for f in futures if f in done)


def _loop_factory() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def run_daemon(config: RunConfig) -> int:
    console = log.Console()
    console.start()
    logger = log.setup(console, config.log_level)
    try:
        try:
            rundir = RunDir.create(config.log_dir, config.run_id, os.getpid(), time.time())
        except OSError as exc:
            logger.error("cannot create the run directory under %s: %s", config.log_dir, exc)  # noqa: TRY400
            return EXIT_USAGE
        with asyncio.Runner(loop_factory=_loop_factory) as runner:
            return runner.run(Supervisor(config, rundir, logger, console).run())
    except Exception:
        logger.exception("internal_error")
        return EXIT_FAILED
    finally:
        console.close()
