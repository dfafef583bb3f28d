"""The daemon: its collaborators, wired once; its services; the loop of generations.

The loop (``loop.Loop``) launches a generation, awaits its end, decides and
applies. Around it the daemon runs what any generation needs: the ranks'
messages (``monitor``), their logs, the control endpoint and the events socket,
the node's services. Signals and control requests arrive as commands on one
queue. Every rank, whatever the reason, is ended by the one termination
procedure in ``supervisor.process.terminate``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

import zmq
import zmq.asyncio

from supervisor import log
from supervisor.checkpoints.sync import CheckpointSync
from supervisor.clock import SYSTEM, Clock
from supervisor.config.run import RunConfig
from supervisor.coord.job import LocalJob, RendezvousJob
from supervisor.core.notable import nccl_tears_down
from supervisor.core.stragglers import Change
from supervisor.core.stragglers import decision as straggler_decision
from supervisor.core.topology import RunIdentity, token_entry
from supervisor.core.types import signal_name
from supervisor.core.watch import Hang
from supervisor.process.evidence import error_file_time
from supervisor.process.orphans import OrphanGuard
from supervisor.process.spawn import RankProcess
from supervisor.process.stacks import activity
from supervisor.process.tail import LogFollower
from supervisor.process.terminate import Signaller
from supervisor.runtime.lifecycle import closing, deciding, hangs, signals, status
from supervisor.runtime.lifecycle.ending import Ender
from supervisor.runtime.lifecycle.hosting import Hosting
from supervisor.runtime.lifecycle.launcher import Launcher
from supervisor.runtime.lifecycle.learned import LearnedFile
from supervisor.runtime.lifecycle.loop import Loop
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.lifecycle.stragglers import Stragglers
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
from supervisor.transport.endpoints import Endpoints, bind

EXIT_SUCCESS = 0
EXIT_FAILED = 1  # the daemon's own failure (an internal error)
EXIT_USAGE = 2
T = TypeVar("T")
TAIL_INTERVAL = 0.05
KERNEL_SLACK = 1.0  # seconds before a generation's start whose kernel lines are its evidence too


class Stopped(Exception):
    """A stop signal came: the loop leaves, and whatever it prepared is stopped."""


class Supervisor:
    def __init__(
        self, cfg: RunConfig, rundir: RunDir, logger: logging.Logger, console: log.Console, *,
        clock: Clock = SYSTEM, signaller: Signaller | None = None,
    ) -> None:  # fmt: skip
        self.cfg, self.rundir, self.logger, self.clock = cfg, rundir, logger, clock
        self.token = secrets.token_hex(16)
        self._key_secret = secrets.token_bytes(32)  # never leaves the daemon
        self._signaller = signaller or Signaller()
        self._commands: asyncio.Queue[signals.Command] = asyncio.Queue()
        self._follower = LogFollower(console, tears_down=nccl_tears_down(os.environ))
        self._stopping, self._force = asyncio.Event(), asyncio.Event()
        self._started_at = clock.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slow_lookups: list[dict[str, Any]] = []  # reverse DNS that would stall torch's stores

        # the collaborators: built here, inside the running loop (see start.py), in the
        # order they depend on each other
        self.events = EventLog(rundir.events, logger, clock, run_id=cfg.run_id)
        self.endpoints = Endpoints.create(os.getpid())
        self._context = zmq.asyncio.Context()
        self._sockets = sockets = bind(self._context, self.endpoints)
        self.publisher = Publisher(sockets.events)
        self.events.publish = self.publisher.publish
        self.loop_watch = LoopWatch(clock, self.events)
        self.plugins, self.node = deciding.plugins(cfg, self.events), deciding.NODE
        self.learned = LearnedFile(cfg.state_dir, cfg.run_id, self.events)
        # self.monitor and self.job are made below: reached when samples come
        self.stragglers = Stragglers(
            cfg.stragglers,
            self.events,
            clock,
            generation=lambda: self.monitor.generation,
            act=self._on_straggler,
            share=lambda shared: self.job.share(stragglers=shared),
            nodes=lambda: self.job.sample(),  # noqa: PLW0108 (self.job is made below)
        )
        self.monitor = Monitor(
            sockets.ranks,
            ranks=[s.rank for s in cfg.topology.slots()],
            configured=cfg.ft.timeouts(),
            learned=self.learned.load(),
            clock=clock,
            events=self.events,
            on_hang=self._on_hang,
            secret=self._key_secret,
            loop_watch=self.loop_watch,
            persist=lambda learned: self.learned.save(learned, self.monitor.generation),
            safety_factor=cfg.ft.safety_factor,
            on_work=self.stragglers.work,
        )
        self.advice = IntervalAdvice(self.events, clock, cfg.mtbf)
        self.monitor.on_save, self.monitor.advice = self.advice.saved, self.advice.describe
        self.health = NodeHealth(cfg.health, self.events, clock, cfg.run_id)
        self.kernel = KernelLog(self.events)
        self.hosting = Hosting(cfg, self.events, self.monitor, logger, self._signaller)
        self.metrics = start_metrics(
            cfg.metrics, self.events, run_id=cfg.run_id, node=self.node, wall=clock.wall
        )
        self.job: LocalJob | RendezvousJob = (
            LocalJob(cfg.master_addr, cfg.master_port)
            if cfg.rdzv is None
            else RendezvousJob(cfg.rdzv, cfg.master_port, self.events)
        )
        self._control_server = ControlServer(sockets.control, self._control, self.events, clock)
        self.checkpoints = CheckpointSync(cfg.checkpoint, self.events)  # a no-op without the options
        self.ident = RunIdentity(
            run_id=cfg.run_id,
            max_restarts=cfg.max_restarts,
            signals_to_handle=cfg.signals_to_handle,
            run_dir=str(rundir.root),
            run_token=self.token,
            virtual_local_rank=cfg.virtual_local_rank,
            numa_binding=cfg.numa_binding,
            key_secret=self._key_secret,
        )
        self._launcher = Launcher(
            cfg=cfg,
            rundir=rundir,
            ident=self.ident,
            events=self.events,
            clock=clock,
            follower=self._follower,
            monitor=self.monitor,
            ranks_endpoint=self.endpoints.ranks,
            start_task=self._start_task,
            signaller=self._signaller,
            force=self._force,
            adopts=self.hosting.subreaper or self.hosting.pid1,
        )
        self._ender = Ender(
            cfg,
            monitor=self.monitor,
            events=self.events,
            clock=clock,
            follower=self._follower,
            signaller=self._signaller,
            force=self._force,
            token=self.token,
            persist=self.learned.save,
        )
        self.loop = Loop(
            cfg,
            clock=clock,
            events=self.events,
            logger=logger,
            rundir=rundir,
            launcher=self._launcher,
            job=self.job,
            monitor=self.monitor,
            ender=self._ender,
            checkpoints=self.checkpoints,
            health=self.health,
            kernel=self.kernel,
            plugins=self.plugins,
            node=self.node,
            stopping=self._stopping,
            reported=self._reported,
            group=lambda coro: self._group().create_task(coro),
        )
        self._tg: asyncio.TaskGroup | None = None

    async def run(self) -> int:
        guard = await OrphanGuard.start(token_entry(self.token))
        hosting = self.cfg.hosting
        handled = signals.install(
            self._commands, self.cfg.stop_signals, hosting.reload_signals, hosting.forward_signals
        )
        self.endpoints.publish_info(pid=os.getpid(), run_id=self.cfg.run_id, run_dir=str(self.rundir.root),
                                    started=self.clock.wall(), log_dir=str(self.cfg.log_dir))  # fmt: skip
        self.events.emit(
            "run_started", **status.run_started(self.cfg, self.rundir, self.endpoints, self.monitor)
        )
        status.announce_settings(self.cfg, self.events)
        deciding.announce(self.plugins, self.cfg, self.events)
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
                    refused = await self.health.at_start()  # a quarantined node starts no rank
                    loop = self.loop
                    code = loop.leave(loop.adopt(refused, 0)) if refused is not None else await loop.run()
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
            loop = self.loop
            closing.close_run(
                code,
                cfg=self.cfg,
                events=self.events,
                rundir=self.rundir,
                judgement=loop.judgement,
                node=self.node,
                restarts_used=loop.memory.budget.used,
                stopped=loop.stop_signal is not None,
                generation=None if loop.current is None else loop.current.number,
                completed=loop.completed,
                seconds=self.clock.monotonic() - self._started_at,
            )
            close_metrics(self.metrics)
            self.kernel.close()
            self._sockets.close()
            self._context.term()
            self.endpoints.remove()
        return code

    async def _check_reverse_dns(self) -> None:
        rdzv = self.cfg.rdzv
        lookups = await check_reverse_dns(self.events, multinode=rdzv is not None,
                                          local_addr=rdzv.local_addr if rdzv else None,
                                          clock=self.clock.monotonic)  # fmt: skip
        self._slow_lookups = [r for r in lookups if r["slow"]]

    def _on_hang(self, hang: Hang) -> None:
        gen = self.loop.current
        if gen is None or not gen.started or gen.ended.is_set():
            return
        failing = gen.failing() or any(self._reported(r) is not None for r in gen.ranks.values())
        hangs.deadline_missed(gen, hang, failing=failing, clock=self.clock, events=self.events)

    def _on_straggler(self, change: Change) -> None:
        """A rank stayed slow: ``--straggler-action`` may end the generation on it."""
        gen = self.loop.current
        if gen is None or not gen.started or gen.ended.is_set():
            return
        settings, node = self.cfg.stragglers, self.stragglers.node
        decision = straggler_decision(
            change, settings, self.loop.memory.remaining(self.clock.monotonic()), node
        )
        if decision is not None:
            gen.decide_now(decision)

    # -- commands: signals and the control endpoint ------------------------------------

    async def _dispatch(self) -> None:
        while True:
            command = await self._commands.get()
            if isinstance(command, signals.Stop):
                self._on_stop(command.signum)
            elif isinstance(command, signals.Reload | signals.Forward):
                self.hosting.handle(command, self.loop.current)
            else:
                self.events.emit("status", **self._status())

    def _on_stop(self, signum: int) -> None:
        if self.loop.stop_signal is None:
            self.loop.stop_signal = signum
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
            gen = self.loop.current
            if gen is None or gen.ended.is_set():
                raise RuntimeError("no running generation to restart")
            self.events.emit("restart_requested", generation=gen.number)
            gen.request_restart()
            return {"restarting": gen.number}
        return self._status()

    def _status(self) -> dict[str, Any]:
        now, job = self.clock.monotonic(), self.job
        out = status.build(run_id=self.cfg.run_id, run_dir=str(self.rundir.root), gen=self.loop.current,
                           monitor=self.monitor, uptime=now - self._started_at, now=now,
                           restarts_used=self.loop.memory.budget.used, max_restarts=self.cfg.max_restarts,
                           control_drops={str(k): v for k, v in self._control_server.drops.items()},
                           job=status.job(self.loop.job_gen, job.nodes()) if job.multi else None)  # fmt: skip
        self.stragglers.annotate(out["ranks"])
        return status.daemon(
            out,
            publisher=self.publisher,
            loop_watch=self.loop_watch,
            launcher=self._launcher,
            advice=self.advice.describe(),
            slow_lookups=self._slow_lookups,
        )

    # -- background tasks -----------------------------------------------------------

    async def _tail(self) -> None:
        while True:
            self._follower.poll()
            self._check_reported_failures()
            await self.clock.sleep(TAIL_INTERVAL)

    def _check_reported_failures(self) -> None:
        gen = self.loop.current
        if gen is not None:
            gen.check_exits(self.cfg.exit_grace, self._reported)
            done = self.loop.job_gen is not None and self.job.others_done(self.loop.job_gen.generation)
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
