"""The daemon: launch generations, watch them, end them, decide, repeat.

The loop gathers evidence (exits, hangs, stacks, error files, log tails) and
applies what the core returns: ``core.next_step.route`` says how a generation's end is
decided, ``core.policy.decide`` judges this node's evidence, ``core.next_step.settle``
turns every node's outcome into the job's action and what the budget pays. Signals and
control requests arrive as commands on one queue. Every rank, whatever the
reason, is ended by the one termination procedure in
``supervisor.process.terminate``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import time
from collections.abc import Awaitable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

import zmq
import zmq.asyncio

from supervisor import log
from supervisor.aio import first
from supervisor.checkpoints.sync import CheckpointSync
from supervisor.clock import Clock
from supervisor.config.run import RunConfig
from supervisor.coord.job import JobGeneration, JobOver, LocalJob, RendezvousJob
from supervisor.core.jobwide import NodeOutcome, PeerNews
from supervisor.core.learning import Learned
from supervisor.core.next_step import Settlement, settle
from supervisor.core.notable import nccl_tears_down
from supervisor.core.states import GroupResult
from supervisor.core.stragglers import Change
from supervisor.core.stragglers import decision as straggler_decision
from supervisor.core.topology import RunIdentity, token_entry
from supervisor.core.types import Action, Decision, Reason, signal_name
from supervisor.core.watch import Hang
from supervisor.process.evidence import error_file_time
from supervisor.process.orphans import OrphanGuard
from supervisor.process.spawn import RankProcess
from supervisor.process.stacks import activity
from supervisor.process.tail import LogFollower
from supervisor.process.terminate import Signaller
from supervisor.runtime.lifecycle import closing, hangs, jobwide, lingering, signals, status
from supervisor.runtime.lifecycle.ending import Ender
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.hosting import Hosting
from supervisor.runtime.lifecycle.judge import Judge
from supervisor.runtime.lifecycle.launcher import Launcher
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.lifecycle.stragglers import Stragglers
from supervisor.runtime.lifecycle.verdict import Verdict
from supervisor.runtime.records import statefile
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.records.health import NodeHealth
from supervisor.runtime.records.rundir import RunDir
from supervisor.runtime.services.checkpoint_interval import IntervalAdvice
from supervisor.runtime.services.control import ControlServer
from supervisor.runtime.services.kernellog import KernelLog
from supervisor.runtime.services.loopwatch import LoopWatch
from supervisor.runtime.services.metrics import close_metrics, refresh_metrics, start_metrics
from supervisor.runtime.services.publisher import Publisher
from supervisor.runtime.services.reverse_dns import check_reverse_dns
from supervisor.transport.endpoints import Endpoints, Sockets, bind

EXIT_SUCCESS = 0
EXIT_FAILED = 1  # the daemon's own failure (an internal error)
EXIT_USAGE = 2
T = TypeVar("T")
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
        self._key_secret = secrets.token_bytes(32)  # never leaves the daemon
        self._signaller = signaller or Signaller()
        self._commands: asyncio.Queue[signals.Command] = asyncio.Queue()
        self._follower = LogFollower(console, tears_down=nccl_tears_down(os.environ))
        self._stop_signal: int | None = None
        self._stopping = asyncio.Event()
        self._force = asyncio.Event()
        self._current: Generation | None = None
        self._completed = False  # the job ended without failure: training is done
        self._round: JobGeneration | None = None
        self._started_at = self.clock.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slow_lookups: list[dict[str, Any]] = []  # reverse DNS that would stall torch's stores
        self._state_path = statefile.path_in(config.state_dir)

        # the collaborators: built here, inside the running loop (see start.py), in the
        # order they depend on each other
        self.events = EventLog(self.rundir.events, self.logger, self.clock, run_id=self.cfg.run_id)
        self.endpoints = Endpoints.create(os.getpid())
        self._context = zmq.asyncio.Context()
        self._sockets = sockets = bind(self._context, self.endpoints)
        self.publisher = Publisher(sockets.events)
        self.events.publish = self.publisher.publish
        self.loop_watch = LoopWatch(self.clock, self.events)
        # self.monitor and self.job are made below: reached when samples come
        self.stragglers = Stragglers(self.cfg.stragglers, self.events, self.clock,
                                     generation=lambda: self.monitor.generation, act=self._on_straggler,
                                     share=lambda shared: self.job.share(stragglers=shared),
                                     nodes=lambda: self.job.sample())  # noqa: PLW0108  # fmt: skip
        self.monitor = self._make_monitor(sockets)
        self.advice = IntervalAdvice(self.events, self.clock, self.cfg.mtbf)
        self.monitor.on_save, self.monitor.advice = self.advice.saved, self.advice.describe
        self.judge = Judge(self.cfg, self.events, self.clock)
        self.health = NodeHealth(self.cfg.health, self.events, self.clock, self.cfg.run_id)
        self.kernel = KernelLog(self.events)
        self.verdict = Verdict(self.cfg, judge=self.judge, monitor=self.monitor, kernel=self.kernel,
                               health=self.health, events=self.events, clock=self.clock, logger=self.logger,
                               rundir=self.rundir)  # fmt: skip
        self.hosting = Hosting(self.cfg, self.events, self.monitor, self.logger, self._signaller)
        self.metrics = start_metrics(self.cfg.metrics, self.events, run_id=self.cfg.run_id,
                                     node=self.judge.node, wall=self.clock.wall)  # fmt: skip
        self.job: LocalJob | RendezvousJob = (
            LocalJob(self.cfg.master_addr, self.cfg.master_port)
            if self.cfg.rdzv is None
            else RendezvousJob(self.cfg.rdzv, self.cfg.master_port, self.events)
        )
        self._control_server = ControlServer(sockets.control, self._control, self.events, self.clock)
        self._control_drops = self._control_server.drops
        self.checkpoints = CheckpointSync(self.cfg.checkpoint, self.events)  # a no-op without the options
        self.ident = RunIdentity(
            run_id=self.cfg.run_id,
            max_restarts=self.cfg.max_restarts,
            signals_to_handle=self.cfg.signals_to_handle,
            run_dir=str(self.rundir.root),
            run_token=self.token,
            virtual_local_rank=self.cfg.virtual_local_rank,
            numa_binding=self.cfg.numa_binding,
            key_secret=self._key_secret,
        )
        self._launcher = Launcher(
            cfg=self.cfg,
            rundir=self.rundir,
            ident=self.ident,
            events=self.events,
            clock=self.clock,
            follower=self._follower,
            monitor=self.monitor,
            ranks_endpoint=self.endpoints.ranks,
            start_task=self._start_task,
            signaller=self._signaller,
            force=self._force,
            adopts=self.hosting.subreaper or self.hosting.pid1,
        )
        self._ender = Ender(self.cfg, monitor=self.monitor, events=self.events, clock=self.clock,
                            follower=self._follower, signaller=self._signaller, force=self._force,
                            token=self.token, persist=self._persist)  # fmt: skip
        self._tg: asyncio.TaskGroup | None = None

    async def run(self) -> int:
        guard = await OrphanGuard.start(token_entry(self.token))
        hosting = self.cfg.hosting
        handled = signals.install(self._commands, self.cfg.stop_signals, hosting.reload_signals,
                                  hosting.forward_signals)  # fmt: skip
        self.endpoints.publish_info(
            pid=os.getpid(), run_id=self.cfg.run_id, run_dir=str(self.rundir.root), started=time.time(),
            log_dir=str(self.cfg.log_dir),
        )
        self._announce()
        self.judge.announce()
        self.kernel.start()
        code = EXIT_FAILED
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                background = [
                    tg.create_task(self._dispatch()),
                    tg.create_task(self._tail()),
                    tg.create_task(self.monitor.run()),
                    tg.create_task(self.loop_watch.run()),
                    tg.create_task(self.publisher.run()),
                    tg.create_task(self._control_server.run()),
                    tg.create_task(self.checkpoints.run()),  # the copy-back, then a sync every period
                    tg.create_task(self.hosting.run(guard.pid)),
                    tg.create_task(refresh_metrics(self.metrics, self._status)),
                    tg.create_task(self._check_reverse_dns()),
                ]
                try:
                    refused = await self.verdict.refused_at_start()
                    code = refused if refused is not None else await self._supervise()
                finally:
                    # watchers of ranks that outlived SIGKILL would wait forever
                    for task in [*background, *self._tasks]:
                        task.cancel()
        finally:
            # the last checkpoint sync, whatever the outcome; _supervise ended the ranks
            # (unless the daemon itself failed: then only settled checkpoints are sent)
            await self.checkpoints.final(ranks_gone=code != EXIT_FAILED)
            await self._launcher.close()
            signals.uninstall(handled)
            await guard.close()
            self._finish(code)
            close_metrics(self.metrics)
            self.kernel.close()
            self._sockets.close()
            self._context.term()
            self.endpoints.remove()
        return code

    async def _check_reverse_dns(self) -> None:
        rdzv = self.cfg.rdzv
        local_addr = rdzv.local_addr if rdzv else None
        lookups = await check_reverse_dns(self.events, multinode=rdzv is not None, local_addr=local_addr,
                                          clock=self.clock.monotonic)  # fmt: skip
        self._slow_lookups = [r for r in lookups if r["slow"]]

    def _make_monitor(self, sockets: Sockets) -> Monitor:
        learned, problem = statefile.load(self._state_path)
        if problem is not None:
            self.events.emit("state_unreadable", logging.WARNING, problem=problem)
        ranks = [s.rank for s in self.cfg.topology.slots()]
        configured = self.cfg.ft.timeouts()
        return Monitor(
            sockets.ranks,
            ranks=ranks,
            configured=configured,
            learned=learned,
            clock=self.clock,
            events=self.events,
            on_hang=self._on_hang,
            secret=self._key_secret,
            loop_watch=self.loop_watch,
            persist=lambda learned: self._persist(learned, self.monitor.generation),
            safety_factor=self.cfg.ft.safety_factor,
            on_work=self.stragglers.work,
        )

    def _persist(self, learned: Learned, generation: int | None) -> None:
        """Learned timeouts outlive the run (``--state-dir``); a failed write is reported."""
        try:
            statefile.save(self._state_path, learned, run_id=self.cfg.run_id, generation=generation)
        except OSError as exc:
            self.events.emit("state_unwritable", logging.WARNING, path=str(self._state_path), error=str(exc))

    def _announce(self) -> None:
        self.events.emit(
            "run_started",
            run_dir=str(self.rundir.root),
            pid=os.getpid(),
            control=self.endpoints.control,
            nproc_per_node=self.cfg.topology.nproc_per_node,
            max_restarts=self.cfg.max_restarts,
            program=self.cfg.program.target,
            standby=self.cfg.standby,
            preload=",".join(self.cfg.program.preload) or None,
            timeouts=status.timeouts(self.monitor),
            # what `ft-supervisor classify` needs to decide again as this run decides
            policy=self.cfg.policy.policy.to_json(),
            restart_window=self.cfg.policy.restart_window,
        )
        ignored = (*self.cfg.ft.ignored, *self.cfg.torchrun_ignored)
        if ignored:  # once, each with why: accepted so that command lines run unchanged
            settings = [{"option": option, "why": why} for option, why in ignored]
            self.events.emit("settings_ignored", logging.WARNING, settings=settings)

    # -- the loop -----------------------------------------------------------------

    async def _supervise(self) -> int:
        launcher, job = self._launcher, self.job
        # ranks preload (or the fork server does) while the nodes gather
        prepared = asyncio.ensure_future(launcher.prepare(0, standby=False))
        try:
            started = await self._unless_stopped(job.start())
        except JobOver as over:
            await launcher.discard(prepared)
            return await self._job_over(None, over)
        except BaseException:
            prepared.cancel()
            raise
        # a stop that comes while the fork server still imports the preload is not held up by it
        gen = await self._unless_stopped(prepared)
        if gen is None or not started:
            if gen is not None:
                await launcher.drop(gen)
            return self._stopped_code()
        while True:
            try:
                job_gen = await self._unless_stopped(job.join(gen.number))
            except JobOver as over:
                await launcher.drop(gen)
                return await self._job_over(None, over)
            if job_gen is None:
                await launcher.drop(gen)
                return self._stopped_code()
            self._round = job_gen
            topology = replace(self.cfg.topology, nnodes=job_gen.nnodes, node_rank=job_gen.node_rank)
            gen = await launcher.fit(gen, topology)
            if await self._unless_stopped(self.checkpoints.restored.wait()) is None:  # before any script runs
                await launcher.drop(gen)
                return self._stopped_code()
            if job.multi:
                self._sync_budget(job_gen)
            after = await self._run_generation(gen, job_gen)
            if isinstance(after, int):
                return after
            gen = after

    async def _run_generation(self, gen: Generation, job_gen: JobGeneration) -> Generation | int:
        """Run one generation to its end; the next one, or this node's exit code."""
        launcher, job = self._launcher, self.job
        self._current = gen
        job.note("running", generation=gen.number, node_rank=job_gen.node_rank, nnodes=job_gen.nnodes,
                 ranks=len(gen.ranks))  # fmt: skip
        await launcher.launch(gen, job_gen.master_addr, job_gen.master_port)
        standby = launcher.prepare_standby(gen, self.judge.remaining(), self._stopping)
        upcoming = self._group().create_task(standby)
        watch = asyncio.ensure_future(job.watch(job_gen))
        await first(gen.ended.wait(), self._stopping.wait(), watch)
        news, over = jobwide.heard(watch)
        if news is not None:
            self.events.emit(
                "peer_news", logging.WARNING, generation=gen.number, news=str(news[0]), detail=news[1]
            )
        stopping = self._stop_signal is not None
        if (
            job.multi
            and news is None
            and over is None
            and (stopping or gen.result is not GroupResult.SUCCEEDED)
            and not (gen.lingering and not stopping)  # every other node is done, waiting to agree
        ):
            over = await self._announce_end(job_gen, gen)
        ending = self.clock.monotonic()
        if gen.missed is not None and not stopping:
            await hangs.name_hung(gen, self.monitor, stack_timeout=self.cfg.ft.stack_dump_timeout,
                                  bundle_timeout=self.cfg.ft.bundle_timeout, clock=self.clock,
                                  events=self.events)  # fmt: skip
        if gen.lingering and not stopping:
            ft = self.cfg.ft
            await lingering.examine(gen, self.monitor, grace=self.cfg.exit_grace,
                                    restarts_left=self.judge.remaining(), stack_timeout=ft.stack_dump_timeout,
                                    bundle_timeout=ft.bundle_timeout, clock=self.clock,
                                    events=self.events)  # fmt: skip
        gen.trouble_at = (
            None
            if gen.result is GroupResult.SUCCEEDED and news is None and not stopping
            else gen.trouble_began(ending, self.monitor.exception_at)
        )
        report = await self._ender.end(gen, stop_signal=self._stop_signal, why=self._why_ending(gen, news))
        if stopping or over is not None:
            await launcher.discard(upcoming)
            return await self._job_over(job_gen, over) if over is not None else self._stopped_code()
        decision = await self.verdict.decide(gen, report, news, self._reported)
        if decision is not None:
            decision = await self.verdict.mark_health(decision, gen.number)
        own = jobwide.own_outcome(job_gen, decision, self.judge.classification, self.judge.node)
        try:
            outcomes = await self._unless_stopped(job.agree(job_gen, own))
        except JobOver as gone:
            await launcher.discard(upcoming)
            return await self._job_over(job_gen, gone)
        if outcomes is None:
            await launcher.discard(upcoming)
            return self._stopped_code()
        settled = settle(own, outcomes, multi=job.multi)
        action = settled.action
        if job.multi:
            self.events.emit("job_decision", generation=gen.number, action=str(action),
                             outcomes=[o.to_json() for o in outcomes])  # fmt: skip
        self._completed = action is Action.CONTINUE
        if action is Action.RESTART:
            return await self._restart(job_gen, gen, settled, upcoming)
        await launcher.discard(upcoming)
        if settled.adopted is not None:
            decision = settled.adopted
            self.judge.adopt(decision, gen.number)
        live = sum(1 for o in outcomes if o.reason is not Reason.NODE_LOST)
        await job.finish(job_gen, action, job_over=action is not Action.RESCHEDULE, live=live)
        if decision is None:
            return EXIT_SUCCESS
        self.judge.report(decision, self.logger, self.rundir.root)
        return self.cfg.policy.exit_codes.of(action)

    async def _unless_stopped(self, aw: Awaitable[T]) -> T | None:
        """``aw``'s result, or None when a stop signal came first (``aw`` is then cancelled)."""
        task = asyncio.ensure_future(aw)
        await first(task, self._stopping.wait())
        if not task.done():
            return None
        return task.result()

    def _stopped_code(self) -> int:
        assert self._stop_signal is not None
        return 128 + self._stop_signal

    def _why_ending(self, gen: Generation, news: tuple[PeerNews, str] | None) -> str:
        if self._stop_signal is not None:
            return f"stop requested ({signal_name(self._stop_signal)})"
        if news is not None:
            return f"peer news: {news[0]}"
        if gen.restart_requested:
            return "restart requested"
        return f"generation {gen.number} {gen.result}"

    async def _announce_end(self, job_gen: JobGeneration, gen: Generation) -> JobOver | None:
        why = "stopping" if self._stop_signal is not None else f"generation {gen.number} {gen.result}"
        try:
            await self.job.announce_end(job_gen, why)
            if self._stop_signal is not None:
                # the others need not wait for this node's keep-alive to go stale
                left = NodeOutcome(job_gen.node_rank, Action.RESCHEDULE, Reason.STOPPED,
                                   "stopped by a signal", node=self.judge.node)  # fmt: skip
                await self.job.publish(job_gen, left)
                await self.job.finish(job_gen, Action.RESCHEDULE, job_over=False)
        except JobOver as over:
            return over
        return None

    async def _job_over(self, job_gen: JobGeneration | None, over: JobOver) -> int:
        """The job cannot go on with this node (the rendezvous ended, timed out, or is gone)."""
        self.events.emit("job_over", logging.WARNING, action=str(over.action), reason=str(over.reason),
                         detail=over.detail)  # fmt: skip
        if job_gen is not None and over.reason is not Reason.RENDEZVOUS_LOST:
            await self.job.finish(job_gen, over.action, job_over=False)
        if over.action is Action.CONTINUE:
            return EXIT_SUCCESS  # a spare let go: the job is done without it
        decision = Decision(over.action, over.reason, over.detail)
        self.judge.adopt(decision, 0 if self._current is None else self._current.number)
        self.judge.report(decision, self.logger, self.rundir.root)
        return self.cfg.policy.exit_codes.of(over.action)

    async def _restart(
        self,
        job_gen: JobGeneration,
        gen: Generation,
        settled: Settlement,
        upcoming: asyncio.Task[Generation | None],
    ) -> Generation | int:
        """The job restarts: spend the budget if a failure did, then the next generation."""
        if settled.spends:
            self.judge.restarted()
        if settled.records:
            await self.job.count_restart()
        standby = await upcoming
        try:
            return standby or await self._launcher.prepare(gen.number + 1, standby=False)
        except OSError as exc:
            return await self._cannot_spawn(job_gen, gen.number + 1, exc)

    async def _cannot_spawn(self, job_gen: JobGeneration, generation: int, exc: OSError) -> int:
        """This node cannot start ranks (their log files: a full or failing disk): run elsewhere."""
        self.events.emit("spawn_failed", logging.ERROR, generation=generation, error=f"{exc.strerror or exc}",
                         path=exc.filename)  # fmt: skip
        decision = Decision(Action.RESCHEDULE, Reason.SPAWN_FAILED,
                            f"generation {generation}'s ranks could not be started: {exc}")  # fmt: skip
        self.judge.adopt(decision, generation)
        await self.job.finish(job_gen, Action.RESCHEDULE, job_over=False)
        self.judge.report(decision, self.logger, self.rundir.root)
        return self.cfg.policy.exit_codes.of(Action.RESCHEDULE)

    def _sync_budget(self, job_gen: JobGeneration) -> None:
        """A node that joined late takes on the restarts the job already spent."""
        for _ in range(job_gen.restarts_used - self.judge.budget.used):
            self.judge.restarted()

    def _on_hang(self, hang: Hang) -> None:
        gen = self._current
        if gen is None or not gen.started or gen.ended.is_set():
            return
        failing = gen.failing() or any(self._reported(r) is not None for r in gen.ranks.values())
        hangs.deadline_missed(gen, hang, failing=failing, clock=self.clock, events=self.events)

    def _on_straggler(self, change: Change) -> None:
        """A rank stayed slow: ``--straggler-action`` may end the generation on it."""
        gen = self._current
        if gen is None or not gen.started or gen.ended.is_set():
            return
        settings, node = self.cfg.stragglers, self.stragglers.node
        decision = straggler_decision(change, settings, self.judge.remaining(), node)
        if decision is not None:
            gen.decide_now(decision)

    # -- commands: signals and the control endpoint ------------------------------------

    async def _dispatch(self) -> None:
        while True:
            command = await self._commands.get()
            if isinstance(command, signals.Stop):
                self._on_stop(command.signum)
            elif isinstance(command, signals.Reload | signals.Forward):
                self.hosting.handle(command, self._current)
            else:
                self.events.emit("status", **self._status())

    def _on_stop(self, signum: int) -> None:
        if self._stop_signal is None:
            self._stop_signal = signum
            self.events.emit("stop_requested", signal=signal_name(signum))
            self._stopping.set()
        elif signum == signal.SIGINT and not self._force.is_set():
            self.events.emit("stop_forced", signal=signal_name(signum))
            self._force.set()

    def _control(self, command: str) -> Any:
        if command == "stop":
            self._commands.put_nowait(signals.Stop(signal.SIGTERM))
            return {"stopping": True}
        if command == "restart":
            gen = self._current
            if gen is None or gen.ended.is_set():
                raise RuntimeError("no running generation to restart")
            self.events.emit("restart_requested", generation=gen.number)
            gen.request_restart()
            return {"restarting": gen.number}
        return self._status()

    def _status(self) -> dict[str, Any]:
        out = self._status_of_ranks()
        self.stragglers.annotate(out["ranks"])
        refused = {f"events_{k}": v for k, v in self.publisher.refused.items()}
        out["dropped"] = {**out.get("dropped", {}), **refused}
        lw = self.loop_watch
        # the daemon's own health: how late its loop ran, and for how long it was stalled
        out["loop"] = {"worst_lag": round(lw.worst_lag, 4), "stalls": len(lw.stalls),
                       "stalled_seconds": round(lw.stalled_total, 3)}  # fmt: skip
        out["standby"] = self._launcher.standby
        out["fork_server"] = self._launcher.fork_server
        out["checkpoint_interval"] = self.advice.describe()
        out["reverse_dns_slow"] = self._slow_lookups
        return out

    def _status_of_ranks(self) -> dict[str, Any]:
        return status.build(
            run_id=self.cfg.run_id,
            run_dir=str(self.rundir.root),
            gen=self._current,
            monitor=self.monitor,
            uptime=self.clock.monotonic() - self._started_at,
            now=self.clock.monotonic(),
            restarts_used=self.judge.budget.used,
            max_restarts=self.cfg.max_restarts,
            control_drops={str(k): v for k, v in self._control_drops.items()},
            job=status.job(self._round, self.job.nodes()) if self.job.multi else None,
        )

    # -- background tasks -----------------------------------------------------------

    async def _tail(self) -> None:
        while True:
            self._follower.poll()
            self._check_reported_failures()
            await asyncio.sleep(TAIL_INTERVAL)

    def _check_reported_failures(self) -> None:
        gen = self._current
        if gen is not None:
            gen.check_exits(self.cfg.exit_grace, self._reported)
            done = self._round is not None and self.job.others_done(self._round.generation)
            gen.check_lingering(self.cfg.exit_grace, activity, other_nodes_done=done)

    def _reported(self, rank: RankProcess) -> str | None:
        """How the live ``rank`` said it failed, if it did."""
        if rank.slot.rank in self.monitor.exceptions:
            return "exception report"
        if error_file_time(rank.files.error_file) is not None:
            return "error file"
        said = self._follower.going_down(rank.slot.rank)
        return None if said is None else f"its log: {said[:400]}"

    def _group(self) -> asyncio.TaskGroup:
        assert self._tg is not None, "run() first"
        return self._tg

    def _start_task(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = self._group().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _finish(self, code: int) -> None:
        closing.close_run(
            code,
            cfg=self.cfg,
            events=self.events,
            rundir=self.rundir,
            judge=getattr(self, "judge", None),
            stopped=self._stop_signal is not None,
            generation=None if self._current is None else self._current.number,
            completed=self._completed,
            seconds=self.clock.monotonic() - self._started_at,
        )
