"""Bringing generations to life: spawn their ranks (ahead of time, as standbys,
when possible) into their generation's cgroup where there are cgroups, release
them with their go, and drop standbys nobody needs."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

import orjson

from supervisor import log
from supervisor.aio import first
from supervisor.clock import Clock
from supervisor.config.run import RunConfig
from supervisor.core.catalogue.generation import Containment as ContainmentEvent
from supervisor.core.catalogue.generation import GenerationStarted, StandbyFailed, StandbyReady
from supervisor.core.catalogue.job import NodeMoved
from supervisor.core.catalogue.ranks import RankSpawned
from supervisor.core.standby_start import AFTER_STEPS, CpuRoom, standby_start
from supervisor.core.states import RankState
from supervisor.core.topology import (
    ENV_PREMAP,
    ENV_RANKS_ENDPOINT,
    ENV_TIMEOUTS,
    RankSlot,
    RunIdentity,
    Topology,
    master_env,
    rank_env,
    token_entry,
)
from supervisor.process import cgroups
from supervisor.process.bootstrap import may_leave_idle
from supervisor.process.cgroups import Containment
from supervisor.process.native import flight_recorder_env
from supervisor.process.orphans import off_loop, sweep_generation
from supervisor.process.tail import LogFollower
from supervisor.process.terminate import Signaller, terminate
from supervisor.runtime.lifecycle.ending import release
from supervisor.runtime.lifecycle.forking import ForkServing
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.lifecycle.processes import Spawn, cpu_room, spawn_rank
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.records.rundir import RunDir

# Standbys preload at SCHED_IDLE where the ranks may leave it (the daemon's
# credentials and limits are theirs), once the generation has settled: its ranks stepped,
# or STANDBY_SETTLE seconds for ranks that report no steps.
IDLE_STANDBYS = may_leave_idle()
STANDBY_SETTLE = 5.0

StartTask = Callable[[Coroutine[Any, Any, None], str], None]


class Launcher:
    def __init__(
        self,
        *,
        cfg: RunConfig,
        rundir: RunDir,
        ident: RunIdentity,
        events: EventLog,
        clock: Clock,
        follower: LogFollower,
        monitor: Monitor,
        ranks_endpoint: str,
        start_task: StartTask,
        signaller: Signaller,
        force: asyncio.Event,
        adopts: bool = False,
        spawn: Spawn = spawn_rank,
        cpu_room: Callable[[], CpuRoom] = cpu_room,
        snapshots: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self._rundir = rundir
        self._ident = ident
        self._events = events
        self._clock = clock
        self._follower = follower
        self._monitor = monitor
        self._ranks_endpoint = ranks_endpoint
        self._start_task = start_task
        self._signaller = signaller
        self._spawn = spawn
        self._cpu_room = cpu_room
        self._snapshots = snapshots  # the daemon's snapshot directory, which standbys map from
        self._launched_with = CpuRoom(1, 1, 0.0)  # what the CPUs did as the last generation launched
        self._force = force
        self.topology = cfg.topology  # this node's place in the job, as of the last job generation
        self._containment: Containment | None = None  # the run's, found with the first generation
        self._containing = asyncio.Lock()
        # the next generation's standbys: spawned, ready (preloaded) and how long that took
        self.standby: dict[str, Any] | None = None
        self._forks = ForkServing(cfg, events, clock, adopts=adopts, log=rundir.root / "fork_server.log")

    async def prepare(self, number: int, *, standby: bool, topology: Topology | None = None) -> Generation:
        """Spawn a generation's ranks; they wait for their go. Until the
        rendezvous says otherwise, this node keeps the place it had last."""
        gen = Generation(number, self._clock, self._events, lambda rank: self._exited(number, rank),
                         self._follower.waited, witnessed_of=self._follower.witnessed)  # fmt: skip
        gen.topology = topology or self.topology
        try:
            await self.containment()
            for slot in gen.topology.slots():
                await self._spawn_into(gen, slot.local_rank, standby=standby)
        except BaseException:
            # stopped (or failed) part way: the ranks spawned so far never get their go, and
            # nothing else holds them; no await here, a cancelled task must not wait
            for rank in gen.ranks.values():
                rank.close_boot()
                self._signaller.group(rank.pid, signal.SIGKILL)
            raise
        return gen

    async def containment(self) -> Containment:
        """The run's containment: its cgroup, created and tried out the first time
        (off the loop: the probe starts a process), or the fallback and why."""
        async with self._containing:
            if self._containment is None:
                where = (
                    cgroups.run_cgroup(token_entry(self._ident.run_token))
                    if self.cfg.cgroups
                    else "--no-cgroups was given"
                )
                try:
                    found = await off_loop(lambda: cgroups.open_run(where), cgroups.PROBE_TIMEOUT + 1.0)
                except TimeoutError:
                    found = Containment(why=f"trying out {where} took over {cgroups.PROBE_TIMEOUT} s")
                self._containment = found
                self._events.emit(ContainmentEvent(**found.describe()))
            return self._containment

    def _placement(self, number: int) -> Containment:
        """Generation ``number``'s cgroup (once per rank: it may exist already)."""
        assert self._containment is not None
        try:
            return self._containment.generation(number)
        except OSError as exc:  # the run's cgroup works, but no more cgroups can be made
            why = f"cannot create generation {number}'s cgroup: {exc.strerror}"
            self._events.emit(ContainmentEvent(generation=number, mode="fallback", why=why), logging.WARNING)
            return Containment(why=why)

    def _exited(self, generation: int, rank: int) -> Mapping[Path, int]:
        """A rank's process is gone: no deadline holds it any more (its watch's
        observations stay), and its logs up to now are its own."""
        self._monitor.rank_gone(generation, rank)
        return self._follower.exited(rank)

    async def fit(self, gen: Generation, topology: Topology) -> Generation:
        """The generation's ranks, for this node's place in the job generation.

        A node whose rank or world changed (nodes joined or left) drops ranks
        spawned for its old place: RANK is fixed when a rank starts."""
        self.topology = topology
        if gen.topology == topology:
            return gen
        self._events.emit(
            NodeMoved(
                generation=gen.number,
                node_rank=topology.node_rank,
                nnodes=topology.nnodes,
                was_node_rank=gen.topology.node_rank,
                was_nnodes=gen.topology.nnodes,
            ),
        )
        await self.drop(gen)
        return await self.prepare(gen.number, standby=False, topology=topology)

    def _monitor_env(self) -> dict[str, str]:
        described = self._monitor.learned.describe(self._monitor.configured)
        return {ENV_RANKS_ENDPOINT: self._ranks_endpoint, ENV_TIMEOUTS: orjson.dumps(described).decode()}

    def _env(self, gen: Generation, slot: RankSlot) -> dict[str, str]:
        files = self._rundir.rank_files(gen.number, slot.local_rank)
        env = rank_env(
            os.environ,
            gen.topology,
            slot,
            self._ident,
            generation=gen.number,
            error_file=str(files.error_file),
        )
        env.update(self._monitor_env())
        env.update(flight_recorder_env(env, files.dir.parent, self.cfg.ranks_torch))
        return env

    async def _spawn_into(self, gen: Generation, local_rank: int, *, standby: bool) -> None:
        slot = gen.topology.slots()[local_rank]
        files = self._rundir.rank_files(gen.number, local_rank)
        env = self._env(gen, slot)
        env.pop(ENV_PREMAP, None)  # a standby's only, never inherited
        if standby and self._snapshots is not None and self.cfg.program.kind != "exec":
            env[ENV_PREMAP] = str(self._snapshots)  # its rank's slots, mapped before its go
        placement = self._placement(gen.number)
        rank = await self._forks.fork(gen.topology, slot, env, files, env_for=lambda s: self._env(gen, s),
                                      run_token=self._ident.run_token, standby=standby,
                                      containment=placement)  # fmt: skip
        if rank is None:
            rank = await self._spawn(self.cfg.program, slot, env, files, now=self._clock.monotonic(),
                                     standby=standby, containment=placement)  # fmt: skip
        gen.add(rank)
        self._start_task(gen.watch(rank), f"watch-gen{gen.number}-rank{local_rank}")
        self._events.emit(
            RankSpawned(
                generation=gen.number,
                rank=slot.rank,
                local_rank=local_rank,
                pid=rank.pid,
                standby=standby,
                forked=not isinstance(rank.proc, asyncio.subprocess.Process),
            ),
        )

    @property
    def fork_server(self) -> dict[str, Any] | None:
        """The fork server as ``status`` shows it: on (pid, modules, seconds) or off and why."""
        return self._forks.describe()

    async def close(self) -> None:
        """End the fork server (the ranks it forked are the daemon's to end)."""
        await self._forks.close(self.cfg.kill_timeout)

    async def prepare_standby(
        self, current: Generation, restarts_left: int, stopping: asyncio.Event
    ) -> Generation | None:
        """Spawn the next generation's ranks once the current ones have started up:
        every rank has completed a step (or, for ranks that report no steps,
        ``STANDBY_SETTLE`` seconds have passed), or at once where the node's idle
        cores as the generation launched cover its ranks and their standbys
        (``core.standby_start``).

        A fault-free job must not pay for fault tolerance. Measured on 2 cores,
        standbys preloading beside generation 0's start-up made its first step
        1.3-1.9 s later (4.2 s against 2.4 s, torchrun 3.1 s) even at SCHED_IDLE:
        idle priority shares out CPU time, not caches, memory bandwidth or the
        kernel's locks. Once the ranks step, a standby preloads at idle priority
        where it may come back from it (``bootstrap.may_leave_idle``), so it slows
        no step either; a failure before it is ready hurries it (``launch``).
        """
        if not self.cfg.standby or restarts_left == 0:
            return None
        start = standby_start(self._launched_with, len(current.ranks))
        ready = asyncio.gather(*(r.ready() for r in current.ranks.values()))
        if await first(ready, current.ended.wait(), stopping.wait()) is not ready:
            return None
        if not all(ready.result()) or current.ended.is_set():
            return None
        if start.when == AFTER_STEPS:
            await first(self._monitor.stepping.wait(), self._clock.sleep(STANDBY_SETTLE),
                        current.ended.wait(), stopping.wait())  # fmt: skip
        if current.ended.is_set() or stopping.is_set():
            return None
        since = self._clock.monotonic()
        try:
            upcoming = await self.prepare(current.number + 1, standby=True, topology=current.topology)
        except OSError as exc:  # its log files (a full disk): the next generation starts cold
            self._events.emit(StandbyFailed(generation=current.number + 1,
                                            error=f"{exc.strerror or exc}", path=exc.filename))  # fmt: skip
            return None
        self.standby = {"generation": upcoming.number, "ranks": len(upcoming.ranks), "ready": False,
                        "priority": "idle" if IDLE_STANDBYS else "normal", "start": start.when,
                        "idle_cores": start.idle_cores, "why": start.why}  # fmt: skip
        self._start_task(self._announce_ready(upcoming, since), f"standby-ready-gen{upcoming.number}")
        return upcoming

    async def _announce_ready(self, gen: Generation, since: float) -> None:
        """``standby_ready`` once every standby of ``gen`` has preloaded: from then on a
        failure restarts at the cost of a go, not of importing torch."""
        try:
            ready = await asyncio.gather(*(r.ready() for r in gen.ranks.values()))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            return  # dropped before it was ready
        if not all(ready) or self.standby is None or self.standby["generation"] != gen.number:
            return
        seconds = round(self._clock.monotonic() - since, 3)
        self.standby = {**self.standby, "ready": True, "seconds": seconds}
        self._events.emit(StandbyReady(generation=gen.number, ranks=len(ready), seconds=seconds,
                                       priority=self.standby["priority"], start=self.standby["start"],
                                       idle_cores=self.standby["idle_cores"]))  # fmt: skip

    async def launch(self, gen: Generation, master_addr: str, master_port: int) -> None:
        self._launched_with = self._cpu_room()  # before its ranks load the node
        for lr, rank in list(gen.ranks.items()):
            if rank.state is RankState.FAILED:  # a standby that died while waiting
                await self._spawn_into(gen, lr, standby=False)
        # learned timeouts may have changed since a standby was spawned
        late = master_env(master_addr, master_port) | self._monitor_env()
        standby = [lr for lr, r in gen.ranks.items() if r.state is RankState.STANDBY]
        self._events.emit(
            GenerationStarted(
                generation=gen.number,
                master_addr=master_addr,
                master_port=master_port,
                node_rank=gen.topology.node_rank if gen.topology.nnodes > 1 else None,
                nnodes=gen.topology.nnodes if gen.topology.nnodes > 1 else None,
                standby_ranks=len(standby),
                standby_ready=sum(1 for lr in standby if gen.ranks[lr].is_ready),
            ),
        )
        self._monitor.start_generation(gen.number, {r.slot.rank: r.pid for r in gen.ranks.values()})
        self._forget_standby(gen)  # running now: there is no standby until the next is spawned
        for rank in gen.ranks.values():
            released = rank.state is RankState.STANDBY
            if released:
                rank.move_to(RankState.RUNNING)
            rank.go(late)
            if released:
                rank.hurry()
        for lr, rank in gen.ranks.items():
            shown = self.cfg.console_streams(lr)
            for stream, path in ((log.STDOUT, rank.files.stdout), (log.STDERR, rank.files.stderr)):
                # torchrun's --duplicate-std*-filters: one file per generation, as its per attempt
                needles = self.cfg.duplicate_filters(stream)
                into = path.parent.parent / f"filtered_{path.name}" if needles else None
                self._follower.follow(
                    rank.slot.rank, path, stream, show=stream in shown, duplicate=needles, into=into
                )
        gen.start()

    async def discard(self, upcoming: asyncio.Task[Generation | None]) -> None:
        """Stop standby ranks that will never get their go, and forget their files."""
        gen = await upcoming
        if gen is not None:
            await self.drop(gen)

    def _forget_standby(self, gen: Generation) -> None:
        if self.standby is not None and self.standby["generation"] == gen.number:
            self.standby = None

    async def drop(self, gen: Generation) -> None:
        """Stop ranks that never got their go, and forget their files and cgroup."""
        self._forget_standby(gen)
        for rank in gen.ranks.values():
            rank.close_boot()
        ranks = list(gen.ranks.values())
        entry = token_entry(self._ident.run_token, gen.number)
        # no token sweep where there is no cgroup: a standby never ran the program
        contained = [r for r in ranks if r.containment.cgroup is not None]
        await terminate(
            ranks,
            grace=self.cfg.shutdown_timeout,
            kill_timeout=self.cfg.kill_timeout,
            force=self._force,
            sweep=(lambda: sweep_generation(entry, contained)) if contained else None,
            signals=self._signaller,
            clock=self._clock,
        )
        await release(gen, self._events, self.cfg.kill_timeout)
        self._rundir.forget_generation(gen.number)
