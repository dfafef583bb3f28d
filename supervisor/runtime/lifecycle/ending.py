"""Ending a generation: the dying-gasp save, the one termination procedure (its
sweep kills the generation's cgroup, or where it has none finds its descendants
by token), the cgroup's removal, and what the generation taught (learned timeouts)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from supervisor.clock import Clock
from supervisor.config.run import RunConfig
from supervisor.core.catalogue.generation import CgroupNotEmpty, TimeoutsLearned
from supervisor.core.catalogue.generation import GenerationEnded as GenerationEndedEvent
from supervisor.core.catalogue.ranks import RankUnkillable
from supervisor.core.jobwide import PeerNews
from supervisor.core.learning import Learned, learn, observe
from supervisor.core.topology import token_entry
from supervisor.process.orphans import release_generation, sweep_generation
from supervisor.process.spawn import RankProcess
from supervisor.process.tail import LogFollower
from supervisor.process.terminate import Signaller, terminate
from supervisor.runtime.lifecycle import gasp, signals
from supervisor.runtime.lifecycle.ended import GenerationEnded, freeze
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.records.events import EventLog


async def release(gen: Generation, events: EventLog, timeout: float) -> None:
    """Remove the generation's cgroup, now that its processes are killed. One that
    stays populated holds a process that outlived SIGKILL (stuck in the kernel,
    perhaps holding a device): it is reported, and left for the sentinel to remove
    at the daemon's exit, or the next daemon in this cgroup once it is empty."""
    busy = await release_generation(list(gen.ranks.values()), timeout)
    for path, pids in busy.items():
        events.emit(CgroupNotEmpty(generation=gen.number, cgroup=path, pids=pids))


class Ender:
    def __init__(
        self,
        cfg: RunConfig,
        *,
        monitor: Monitor,
        events: EventLog,
        clock: Clock,
        follower: LogFollower,
        signaller: Signaller,
        force: asyncio.Event,
        token: str,
        persist: Callable[[Learned, int | None], None],
    ) -> None:
        self._cfg = cfg
        self._monitor = monitor
        self._events = events
        self._clock = clock
        self._follower = follower
        self._signaller = signaller
        self._force = force
        self._token = token
        self._persist = persist

    async def end(
        self, gen: Generation, *, stop_signal: int | None, why: str, news: tuple[PeerNews, str] | None,
        reported: Callable[[RankProcess], str | None],
    ) -> GenerationEnded:  # fmt: skip
        """Ask the ranks that can save to do so, stop every rank of ``gen``, and
        return how it ended (``reported``: how a live rank said it failed, if it did)."""
        cfg = self._cfg
        await gasp.ask_to_save(gen, self._monitor, deadline=cfg.save_timeout, why=why, events=self._events,
                               clock=self._clock, force=self._force)  # fmt: skip
        entry = token_entry(self._token, gen.number)
        gen.stop_wall, gen.stop_mono = self._clock.wall(), self._clock.monotonic()
        # ft_launcher's --term-timeout: a stop signal passed on may get a grace of its own
        grace = cfg.term_timeout if stop_signal is not None and cfg.term_timeout is not None else None
        report = await terminate(
            list(gen.ranks.values()),
            grace=cfg.shutdown_timeout if grace is None else grace,
            kill_timeout=cfg.kill_timeout,
            force=self._force,
            stop_signal=signal.SIGTERM if stop_signal is None else signals.forwarded(stop_signal),
            signal_for={
                **dict.fromkeys(gen.hangs, cfg.ft.rank_termination_signal),
                **dict.fromkeys(gen.stuck, signal.SIGKILL),  # it failed already; only exiting is left
                **dict.fromkeys(gen.lingering, signal.SIGKILL),  # its peers are gone; so is its work
            },
            sweep=lambda: sweep_generation(entry, list(gen.ranks.values())),
            signals=self._signaller,
            clock=self._clock,
        )
        # a rank that outlived SIGKILL keeps the cgroup populated: no use waiting for it
        await release(gen, self._events, 0.0 if report.unkillable else cfg.kill_timeout)
        gen.notable = self._follower.finish()
        gen.after_exit = self._follower.after_exit
        self._learn(gen)
        if report.unkillable:
            for lr in report.unkillable:  # given up on: its watch may never see it exit
                gen.ranks[lr].close_boot()
            self._events.emit(
                RankUnkillable(
                    generation=gen.number,
                    local_ranks=list(report.unkillable),
                    pids=[gen.ranks[lr].pid for lr in report.unkillable],
                    kill_timeout=cfg.kill_timeout,
                ),
            )
        self._events.emit(
            GenerationEndedEvent(
                generation=gen.number,
                result=str(gen.result),
                signalled=len(report.signalled),
                killed=len(report.killed),
                swept=report.swept or None,
                seconds=round(report.seconds, 3),
                iteration=max(self._monitor.iterations(), default=None),
            ),
        )
        return freeze(gen, self._monitor, report, news=news, reported=reported)

    def _learn(self, gen: Generation) -> None:
        monitor, cfg = self._monitor, self._cfg
        watches = monitor.end_generation()
        if not cfg.ft.learn_timeouts or not watches:
            return
        old = monitor.learned
        # only intervals that ended before the trouble began: the hung step, the wait
        # for a dead peer, the stop were not what the work needs
        seen = observe(watches, before=gen.trouble_at)
        new = learn(old, seen, monitor.configured, cfg.ft.safety_factor)
        if new == old:
            return
        monitor.set_learned(new)
        self._persist(new, gen.number)
        self._events.emit(TimeoutsLearned(generation=gen.number, learned=new.to_json(),
                                          in_force=monitor.in_force()))  # fmt: skip
