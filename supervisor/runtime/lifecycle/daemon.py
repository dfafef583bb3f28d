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
import socket
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

import zmq
import zmq.asyncio

from supervisor import log
from supervisor.checkpoints.sync import CheckpointSync
from supervisor.clock import SYSTEM, Clock
from supervisor.config.run import RunConfig
from supervisor.coord.job import JobGeneration, LocalJob, RendezvousJob
from supervisor.core.notable import nccl_tears_down
from supervisor.core.topology import RunIdentity, token_entry
from supervisor.process.tail import LogFollower
from supervisor.runtime.lifecycle import closing, deciding, signals, status
from supervisor.runtime.lifecycle.commands import Commands
from supervisor.runtime.lifecycle.ending import Ender
from supervisor.runtime.lifecycle.hosting import Hosting
from supervisor.runtime.lifecycle.launcher import Launcher
from supervisor.runtime.lifecycle.learned import LearnedFile
from supervisor.runtime.lifecycle.loop import Loop
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.lifecycle.processes import Processes
from supervisor.runtime.lifecycle.running import Running
from supervisor.runtime.lifecycle.stragglers import Stragglers
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.records.health import NodeHealth
from supervisor.runtime.records.rundir import RunDir
from supervisor.runtime.services.checkpoint_interval import IntervalAdvice
from supervisor.runtime.services.control import ControlServer
from supervisor.runtime.services.held_snapshots import HeldSnapshots, remove_stale
from supervisor.runtime.services.job_snapshots import JobSnapshots, across_nodes
from supervisor.runtime.services.kernellog import KernelLog
from supervisor.runtime.services.loopwatch import LoopWatch
from supervisor.runtime.services.metrics import close_metrics, refresh_metrics, start_metrics
from supervisor.runtime.services.publisher import Publisher
from supervisor.runtime.services.reverse_dns import check_reverse_dns
from supervisor.transport.endpoints import Endpoints, bind

EXIT_SUCCESS = 0
EXIT_FAILED = 1  # the daemon's own failure (an internal error)
EXIT_USAGE = 2
TAIL_INTERVAL = 0.05


class Supervisor:
    def __init__(
        self, cfg: RunConfig, rundir: RunDir, logger: logging.Logger, console: log.Console, *,
        clock: Clock = SYSTEM, job: LocalJob | RendezvousJob | None = None,
        processes: Processes | None = None,
    ) -> None:  # fmt: skip
        """``clock``, ``job`` and ``processes`` are the seams a test may fill: the time the
        daemon reads and sleeps on, the other nodes of the job, the ranks' processes."""
        self.cfg, self.rundir, self.logger, self.clock = cfg, rundir, logger, clock
        self.token = secrets.token_hex(16)
        self._key_secret = secrets.token_bytes(32)  # never leaves the daemon
        self.processes = processes = processes or Processes()
        self._signaller = processes.signaller
        self._follower = LogFollower(console, tears_down=nccl_tears_down(os.environ))
        self._stopping, self._force = asyncio.Event(), asyncio.Event()
        self._started_at = clock.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._slow_lookups: list[dict[str, Any]] = []  # reverse DNS that would stall torch's stores

        # the collaborators: built here, inside the running loop (see start.py), in the
        # order they depend on each other
        events = self.events = EventLog(rundir.events, logger, clock, run_id=cfg.run_id)
        self.endpoints = Endpoints.create(os.getpid())
        self._context = zmq.asyncio.Context()
        self._sockets = sockets = bind(self._context, self.endpoints)
        self.publisher = Publisher(sockets.events)
        events.publish = self.publisher.publish
        self.loop_watch = LoopWatch(clock, events)
        self.plugins, self.node = deciding.plugins(cfg, events), deciding.NODE
        self.learned = LearnedFile(cfg.state_dir, cfg.run_id, events)
        self.job = job or (LocalJob(cfg.master_addr, cfg.master_port) if cfg.rdzv is None
                           else RendezvousJob(cfg.rdzv, cfg.master_port, events,
                                              nproc=cfg.topology.nproc_per_node))  # fmt: skip
        self.running = Running(cfg, clock=clock, events=events, follower=self._follower, job=self.job)
        self.stragglers = Stragglers(
            cfg.stragglers, events, clock, generation=lambda: self.monitor.generation,
            act=lambda change: self.running.on_straggler(change, self.stragglers.node),
            share=lambda shared: self.job.share(stragglers=shared), nodes=self.job.sample,
        )  # fmt: skip
        self.monitor = self.running.monitor = Monitor(
            sockets.ranks, ranks=[s.rank for s in cfg.topology.slots()], configured=cfg.ft.timeouts(),
            learned=self.learned.load(), clock=clock, events=events, on_hang=self.running.on_hang,
            secret=self._key_secret, loop_watch=self.loop_watch, safety_factor=cfg.ft.safety_factor,
            persist=lambda learned: self.learned.save(learned, self.monitor.generation),
            on_work=self.stragglers.work,
        )  # fmt: skip
        self.advice = IntervalAdvice(events, clock, cfg.mtbf)
        self.monitor.on_save, self.monitor.advice = self.advice.saved, self.advice.describe
        # the ranks' snapshots, held across generations until the run ends
        self.snapshots = HeldSnapshots(events, clock, budget=cfg.snapshot_memory, token=self.token)
        self.monitor.snapshots.handler = self.snapshots.handle
        self.health = NodeHealth(cfg.health, events, clock, cfg.run_id)
        self.kernel = KernelLog(events)
        self.hosting = Hosting(cfg, events, self.monitor, logger, self._signaller,
                               adopt_orphans=processes.adopt_orphans)  # fmt: skip
        self.metrics = start_metrics(cfg.metrics, events, run_id=cfg.run_id, node=self.node, wall=clock.wall)
        self.checkpoints = CheckpointSync(cfg.checkpoint, events)  # a no-op without the options
        self.ident = RunIdentity(
            run_id=cfg.run_id, max_restarts=cfg.max_restarts, signals_to_handle=cfg.signals_to_handle,
            run_dir=str(rundir.root), run_token=self.token, virtual_local_rank=cfg.virtual_local_rank,
            numa_binding=cfg.numa_binding, key_secret=self._key_secret,
        )  # fmt: skip
        self._launcher = Launcher(
            cfg=cfg, rundir=rundir, ident=self.ident, events=events, clock=clock, follower=self._follower,
            monitor=self.monitor, ranks_endpoint=self.endpoints.ranks, start_task=self._start_task,
            signaller=self._signaller, force=self._force, adopts=self.hosting.subreaper or self.hosting.pid1,
            spawn=processes.spawn,
            cpu_room=processes.cpu_room, snapshots=self.snapshots.directory,
        )  # fmt: skip
        ender = Ender(cfg, monitor=self.monitor, events=events, clock=clock, follower=self._follower,
                      signaller=self._signaller, force=self._force, token=self.token,
                      persist=self.learned.save)  # fmt: skip
        self.loop = self.running.loop = Loop(
            cfg, clock=clock, events=events, logger=logger, rundir=rundir, launcher=self._launcher,
            job=self.job, monitor=self.monitor, ender=ender, checkpoints=self.checkpoints, health=self.health,
            kernel=self.kernel,
            plugins=self.plugins, node=self.node, stopping=self._stopping, reported=self.running.reported,
            signals=self._signaller,
            group=lambda coro: self._group().create_task(coro),
        )  # fmt: skip
        # across nodes: the job agrees on the step, replicas go to the next node's daemon
        self.job_snapshots: JobSnapshots | None = None
        if self.job.multi and cfg.rdzv is not None:
            self.job_snapshots = across_nodes(
                self.snapshots, events, clock, rate=cfg.snapshot_replication_rate, job=cfg.run_id,
                host=cfg.rdzv.local_addr or socket.getfqdn(), inbox=lambda: self.monitor.inbox,
            )  # fmt: skip
            self.monitor.snapshots.handler = self.job_snapshots.handle
            self.loop.on_joined = self._joined
        self.commands = Commands(self.loop, events=events, hosting=self.hosting, stopping=self._stopping,
                                 force=self._force, status=self._status)  # fmt: skip
        self._control_server = ControlServer(sockets.control, self.commands.control, events, clock)

    async def run(self) -> int:
        guard = await self.processes.guard(token_entry(self.token))
        hosting = self.cfg.hosting
        handled = signals.install(self.commands.queue, self.cfg.stop_signals, hosting.reload_signals,
                                  hosting.forward_signals)  # fmt: skip
        self.endpoints.publish_info(pid=os.getpid(), run_id=self.cfg.run_id, run_dir=str(self.rundir.root),
                                    started=self.clock.wall(), log_dir=str(self.cfg.log_dir))  # fmt: skip
        self.events.emit(status.run_started(self.cfg, self.rundir, self.endpoints, self.monitor))
        status.announce_settings(self.cfg, self.events)
        deciding.announce(self.plugins, self.cfg, self.events)
        self.kernel.start()
        remove_stale()  # the snapshots of a daemon that died without removing them
        code = EXIT_FAILED
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                background = [
                    tg.create_task(self.commands.dispatch()),
                    tg.create_task(self.running.tail()),
                    tg.create_task(self.monitor.run()),
                    tg.create_task(self.loop_watch.run()),
                    tg.create_task(self.publisher.run()),
                    tg.create_task(self._control_server.run()),
                    tg.create_task(self.checkpoints.run()),  # the copy-back, then a sync every period
                    tg.create_task(self.hosting.run(guard.pid)),
                    tg.create_task(refresh_metrics(self.metrics, self._status)),
                    tg.create_task(self._check_reverse_dns()),
                ]
                if self.job_snapshots is not None:
                    background.append(tg.create_task(self.job_snapshots.run()))
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
            self.snapshots.release()  # no rank is left to map them
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
            snapshots=self.snapshots.describe(now)
            | ({} if self.job_snapshots is None else {"replication": self.job_snapshots.describe(now)}),
            slow_lookups=self._slow_lookups,
        )

    def _joined(self, job_gen: JobGeneration) -> None:
        assert self.job_snapshots is not None
        topology = replace(self.cfg.topology, nnodes=job_gen.nnodes, node_rank=job_gen.node_rank)
        self.job_snapshots.joined(job_gen, [s.rank for s in topology.slots()])

    def _group(self) -> asyncio.TaskGroup:
        assert self._tg is not None, "run() first"
        return self._tg

    def _start_task(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = self._group().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
