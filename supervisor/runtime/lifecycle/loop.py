"""The loop of generations: launch, await the end, decide, apply; repeat.

A generation's end is one value (``ended.GenerationEnded``); the stages that follow
return values (``deciding``: evidence, classification, decision; the node's health;
the job's agreement, ``core.next_step.job_outcome``), and the loop applies the outcome:
the next generation, or this node's exit code. Ranks prepared and never launched
are ``upcoming``'s to stop, whichever way the loop is left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from supervisor.aio import first
from supervisor.checkpoints.sync import CheckpointSync
from supervisor.clock import Clock
from supervisor.config.run import RunConfig
from supervisor.coord.job import JobGeneration, JobOver, LocalJob, RendezvousJob
from supervisor.core.catalogue.generation import KernelLines, SpawnFailed
from supervisor.core.catalogue.job import JobDecision
from supervisor.core.catalogue.job import JobOver as JobOverEvent
from supervisor.core.catalogue.job import PeerNews as PeerNewsEvent
from supervisor.core.evidence import Evidence
from supervisor.core.job_verdict import desync_decision
from supervisor.core.jobwide import NodeOutcome, PeerNews
from supervisor.core.kmsg import about
from supervisor.core.next_step import Basis, job_outcome
from supervisor.core.policy import Budget
from supervisor.core.states import GroupResult
from supervisor.core.types import Action, Decision, Reason, signal_name
from supervisor.hooks.registry import Registry
from supervisor.process.spawn import RankProcess
from supervisor.process.terminate import Signaller
from supervisor.runtime.lifecycle import closing, deciding, hangs, incident, jobwide, lingering
from supervisor.runtime.lifecycle.deciding import Judgement, Memory
from supervisor.runtime.lifecycle.ended import GenerationEnded
from supervisor.runtime.lifecycle.ending import Ender
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.launcher import Launcher
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.lifecycle.upcoming import Upcoming
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.records.health import NodeHealth
from supervisor.runtime.records.rundir import RunDir
from supervisor.runtime.services.kernellog import KernelLog

EXIT_SUCCESS = 0
T = TypeVar("T")
KERNEL_SLACK = 1.0  # seconds before a generation's start whose kernel lines are its evidence too


class Stopped(Exception):
    """A stop signal came: the loop leaves, and whatever it prepared is stopped."""


class Loop:
    def __init__(
        self, cfg: RunConfig, *, clock: Clock, events: EventLog, logger: logging.Logger, rundir: RunDir,
        launcher: Launcher, job: LocalJob | RendezvousJob, monitor: Monitor, ender: Ender,
        checkpoints: CheckpointSync, health: NodeHealth, kernel: KernelLog, plugins: Registry, node: str,
        stopping: asyncio.Event, reported: Callable[[RankProcess], str | None], signals: Signaller,
        group: Callable[[Coroutine[Any, Any, Generation | None]], asyncio.Task[Generation | None]],
    ) -> None:  # fmt: skip
        self._cfg, self._clock, self._events, self._logger, self._rundir = cfg, clock, events, logger, rundir
        self._launcher, self._job, self._monitor, self._ender = launcher, job, monitor, ender
        self._checkpoints, self._health, self._kernel = checkpoints, health, kernel
        self._plugins, self._node = plugins, node
        self._stopping, self._reported, self._group, self._signals = stopping, reported, group, signals
        self.stop_signal: int | None = None  # set by the daemon with ``stopping``
        # a generation joined, before its ranks launch (the job's snapshot agreement starts)
        self.on_joined: Callable[[JobGeneration], None] = lambda job_gen: None
        self.memory = Memory(Budget(cfg.max_restarts, cfg.policy.restart_window))
        self.current: Generation | None = None  # the generation launched last
        self.job_gen: JobGeneration | None = None  # the job generation this node is in
        self.judgement: Judgement | None = None  # the last decision on this node (reason.json's)
        self.completed = False  # the job ended without failure: training is done

    async def run(self) -> int:
        upcoming = Upcoming(self._launcher, self._stopping)
        try:
            try:
                return await self._generations(upcoming)
            finally:
                await upcoming.close()
        except Stopped:
            assert self.stop_signal is not None
            return 128 + self.stop_signal
        except JobOver as over:
            return await self._job_over(over)

    async def _generations(self, upcoming: Upcoming) -> int:
        launcher, job = self._launcher, self._job
        # ranks preload (or the fork server does) while the nodes gather; a stop that comes
        # while the fork server still imports the preload is not held up by it
        upcoming.preparing(asyncio.ensure_future(launcher.prepare(0, standby=False)), cancellable=True)
        await self._unless_stopped(job.start())
        gen = await self._unless_stopped(upcoming.take())
        while True:
            assert gen is not None
            upcoming.hold(gen)
            self.job_gen = None  # nothing owed to the job until this node has joined
            job_gen = self.job_gen = await self._unless_stopped(job.join(gen.number))
            self.on_joined(job_gen)
            topology = replace(self._cfg.topology, nnodes=job_gen.nnodes, node_rank=job_gen.node_rank)
            upcoming.hold(gen := await launcher.fit(gen, topology))
            await self._unless_stopped(self._checkpoints.restored.wait())  # before any script runs
            if job.multi:  # a node that joined late takes on the restarts the job already spent
                for _ in range(job_gen.restarts_used - self.memory.budget.used):
                    self.memory = self.memory.spent(self._clock.monotonic())
            ended = await self._run(upcoming, job_gen)
            judgement = await self._decide(ended)
            after = await self._apply(ended, judgement, job_gen, upcoming)
            if isinstance(after, int):
                return after
            gen = after

    async def _run(self, upcoming: Upcoming, job_gen: JobGeneration) -> GenerationEnded:
        """Launch the generation and wait for its end; its ranks are down on return."""
        launcher, job = self._launcher, self._job
        gen = self.current = upcoming.launched()
        job.note("running", generation=gen.number, node_rank=job_gen.node_rank, nnodes=job_gen.nnodes,
                 ranks=len(gen.ranks))  # fmt: skip
        await launcher.launch(gen, job_gen.master_addr, job_gen.master_port)
        standby = launcher.prepare_standby(
            gen, self.memory.remaining(self._clock.monotonic()), self._stopping
        )
        upcoming.preparing(self._group(standby))
        watch = asyncio.ensure_future(job.watch(job_gen))
        await first(gen.ended.wait(), self._stopping.wait(), watch)
        news, over = jobwide.heard(watch)
        if news is not None:
            self._events.emit(PeerNewsEvent(generation=gen.number, news=str(news[0]), detail=news[1]))
        stopping = self.stop_signal is not None
        failed = stopping or gen.result is not GroupResult.SUCCEEDED
        # a rank lingering: every other node is done, waiting to agree; there is nothing to announce
        waited_for = bool(gen.lingering) and not stopping
        if job.multi and news is None and over is None and failed and not waited_for:
            over = await self._announce_end(job_gen, gen)
        if not stopping:
            news = await self._examine(gen, job_gen, news) or news
        gen.trouble_at = (
            None
            if gen.result is GroupResult.SUCCEEDED and news is None and not stopping
            else gen.trouble_began(self._clock.monotonic(), self._monitor.exception_at)
        )
        ended = await self._ender.end(gen, stop_signal=self.stop_signal, why=self._why_ending(gen, news),
                                      news=news, reported=self._reported)  # fmt: skip
        if over is not None:
            raise over
        if stopping:
            raise Stopped
        return ended

    async def _examine(
        self, gen: Generation, job_gen: JobGeneration, news: tuple[PeerNews, str] | None
    ) -> tuple[PeerNews, str] | None:
        """Before the kill: who is hung (across the job, where a hang is the job's), or
        whether a rank that outlived its peers was done; the news this node follows
        when the job blames another node's rank."""
        ft = self._cfg.ft
        took_part, follows = await incident.examine(
            gen, self._monitor, self._job.board(job_gen), job_gen, news=news, node=self._node, ft=ft,
            clock=self._clock, events=self._events, signals=self._signals,
        )  # fmt: skip
        if gen.missed is not None and not took_part:
            await hangs.name_hung(
                gen,
                self._monitor,
                stack_timeout=ft.stack_dump_timeout,
                bundle_timeout=ft.bundle_timeout,
                clock=self._clock,
                events=self._events,
                signals=self._signals,
            )
        if gen.lingering:
            await lingering.examine(
                gen,
                self._monitor,
                grace=self._cfg.exit_grace,
                restarts_left=self.memory.remaining(self._clock.monotonic()),
                stack_timeout=ft.stack_dump_timeout,
                bundle_timeout=ft.bundle_timeout,
                clock=self._clock,
                events=self._events,
                signals=self._signals,
            )
        return follows

    async def _decide(self, ended: GenerationEnded) -> Judgement | None:
        """evidence -> classification -> decision -> the node's health; None: it succeeded."""
        way, now = deciding.basis(ended), self._clock.monotonic()
        if way is Basis.SUCCEEDED:
            return None
        if way is not Basis.JUDGE:
            judgement = deciding.undisputed(way, ended, self.memory, now, self._node)
        else:
            dmesg = self._kernel_lines(ended)
            progress, memory = deciding.progress(ended, self.memory)
            evidence = await deciding.evidence_of(ended, node=self._node, dmesg=dmesg, progress=progress)
            policy = self._cfg.policy.policy
            judgement, self.memory = deciding.judge(evidence, self._plugins, policy, memory, now=now,
                                                    bundle=ended.bundle)  # fmt: skip
        if ended.job_blame is not None:  # the job's blame of a hang: every node's reason.json names it
            judgement = replace(judgement, job_blame=ended.job_blame)
            if (desync := desync_decision(ended.job_blame)) is not None:
                # a program error, judged across the job: it stands for this node's own decision,
                # the generation's one decision (a reader of a first one would be misled)
                judgement = judgement.adopting(desync)
        self._record(judgement)
        # the node's ledger records a hardware-looking failure (or its rank that the job
        # blamed for a hang); one too many, and a restart becomes this node's leaving
        # (--node-quarantine)
        c = judgement.classification
        nature, rule = (None, None) if c is None else (c.nature, c.rule)
        screened = await self._health.after(judgement.decision, nature, rule, ended.number,
                                            culprit=ended.job_blame is not None)  # fmt: skip
        if screened is not judgement.decision:
            self._record(judgement := judgement.adopting(screened))
        return judgement

    def _kernel_lines(self, ended: GenerationEnded) -> tuple[str, ...]:
        """The kernel's lines since the generation started that may be about it."""
        if not ended.started:
            return ()
        lines = about(self._kernel.since(ended.started_at - KERNEL_SLACK), ended.pids(), ended.cgroups())
        if lines:  # for ft-supervisor classify, which judges the run again
            self._events.emit(KernelLines(generation=ended.number, lines=list(lines)))
        return lines

    async def _apply(
        self, ended: GenerationEnded, judgement: Judgement | None, job_gen: JobGeneration, upcoming: Upcoming
    ) -> Generation | int:
        """The job's agreement, then its action: the next generation, or this node's exit code."""
        job, decision = self._job, None if judgement is None else judgement.decision
        c = None if judgement is None else judgement.classification
        own = jobwide.own_outcome(job_gen, decision, c, self._node)
        outcomes = await self._unless_stopped(job.agree(job_gen, own))
        outcome = job_outcome(own, outcomes, multi=job.multi)
        action = outcome.action
        if job.multi:
            self._events.emit(JobDecision(generation=ended.number, action=str(action),
                                         outcomes=[o.to_json() for o in outcomes]))  # fmt: skip
        self.completed = action is Action.CONTINUE
        if action is Action.RESTART:
            if outcome.spends:
                self.memory = self.memory.spent(self._clock.monotonic())
            if outcome.records:
                await job.count_restart()
            try:
                return await upcoming.take() or await self._launcher.prepare(ended.number + 1, standby=False)
            except OSError as exc:
                return await self._cannot_spawn(job_gen, ended.number + 1, exc)
        if outcome.adopted is not None:
            judgement = self.adopt(outcome.adopted, ended.number)
        live = sum(1 for o in outcomes if o.reason is not Reason.NODE_LOST)
        await job.finish(job_gen, action, job_over=action is not Action.RESCHEDULE, live=live)
        if judgement is None:
            return EXIT_SUCCESS
        return self.leave(judgement)

    def _record(self, judgement: Judgement) -> None:
        """The one place a decision is recorded: the ``decision`` event, and reason.json's."""
        self.judgement = judgement
        self._events.emit(deciding.decision_event(judgement, self.memory.budget.used))

    def adopt(self, decision: Decision, generation: int) -> Judgement:
        """The job decided for this node (a peer's abort, a job-wide reschedule, a
        rendezvous that ended): this node's evidence stays, the decision is the job's."""
        last = self.judgement or Judgement(
            Evidence((), generation=generation, node=self._node), None, decision
        )
        self._record(judgement := last.adopting(decision))
        return judgement

    def leave(self, judgement: Judgement) -> int:
        closing.tell(judgement, self._cfg, self._events, self._logger, self._rundir.root)
        return self._cfg.policy.exit_codes.of(judgement.decision.action)

    async def _unless_stopped(self, aw: Awaitable[T]) -> T:
        """``aw``'s result; ``Stopped`` when a stop signal came first (``aw`` is then cancelled)."""
        task = asyncio.ensure_future(aw)
        await first(task, self._stopping.wait())
        if not task.done():
            raise Stopped
        return task.result()

    def _why_ending(self, gen: Generation, news: tuple[PeerNews, str] | None) -> str:
        if self.stop_signal is not None:
            return f"stop requested ({signal_name(self.stop_signal)})"
        if news is not None:
            return f"peer news: {news[0]}"
        if gen.restart_requested:
            return "restart requested"
        return f"generation {gen.number} {gen.result}"

    async def _announce_end(self, job_gen: JobGeneration, gen: Generation) -> JobOver | None:
        why = "stopping" if self.stop_signal is not None else f"generation {gen.number} {gen.result}"
        try:
            await incident.declare(self._job.board(job_gen), job_gen, gen, self._clock)  # a hang: the job's
            await self._job.announce_end(job_gen, why)
            if self.stop_signal is not None:
                # the others need not wait for this node's keep-alive to go stale
                left = NodeOutcome(job_gen.node_rank, Action.RESCHEDULE, Reason.STOPPED,
                                   "stopped by a signal", node=self._node)  # fmt: skip
                await self._job.publish(job_gen, left)
                await self._job.finish(job_gen, Action.RESCHEDULE, job_over=False)
        except JobOver as over:
            return over
        return None

    async def _job_over(self, over: JobOver) -> int:
        """The job cannot go on with this node (the rendezvous ended, timed out, or is gone)."""
        self._events.emit(JobOverEvent(action=str(over.action), reason=str(over.reason),
                                      detail=over.detail))  # fmt: skip
        if self.job_gen is not None and over.reason is not Reason.RENDEZVOUS_LOST:
            await self._job.finish(self.job_gen, over.action, job_over=False)
        if over.action is Action.CONTINUE:
            return EXIT_SUCCESS  # a spare let go: the job is done without it
        generation = 0 if self.current is None else self.current.number
        return self.leave(self.adopt(Decision(over.action, over.reason, over.detail), generation))

    async def _cannot_spawn(self, job_gen: JobGeneration, generation: int, exc: OSError) -> int:
        """This node cannot start ranks (their log files: a full or failing disk): run elsewhere."""
        self._events.emit(
            SpawnFailed(generation=generation, error=f"{exc.strerror or exc}", path=exc.filename),
        )
        decision = Decision(Action.RESCHEDULE, Reason.SPAWN_FAILED,
                            f"generation {generation}'s ranks could not be started: {exc}")  # fmt: skip
        judgement = self.adopt(decision, generation)
        await self._job.finish(job_gen, Action.RESCHEDULE, job_over=False)
        return self.leave(judgement)
