"""What ends a running generation before its ranks do: a missed deadline, a straggler,
a failure a live rank reported without exiting, a rank that outlived its peers.

Each is noticed here and written to the live ``Generation`` (which sets its
``ended``); the loop then awaits the end and decides.
"""

from __future__ import annotations

from supervisor.clock import Clock
from supervisor.config.run import RunConfig
from supervisor.coord.job import LocalJob, RendezvousJob
from supervisor.core.stragglers import Change
from supervisor.core.stragglers import decision as straggler_decision
from supervisor.core.watch import Hang
from supervisor.process.evidence import error_file_time
from supervisor.process.spawn import RankProcess
from supervisor.process.stacks import activity
from supervisor.process.tail import LogFollower
from supervisor.runtime.lifecycle import hangs
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.loop import Loop
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.records.events import EventLog

TAIL_INTERVAL = 0.05


class Running:
    def __init__(
        self, cfg: RunConfig, *, clock: Clock, events: EventLog, follower: LogFollower,
        job: LocalJob | RendezvousJob,
    ) -> None:  # fmt: skip
        self._cfg, self._clock, self._events, self._follower, self._job = cfg, clock, events, follower, job
        self.loop: Loop | None = None  # set once the loop is made (it needs ``reported``)
        self.monitor: Monitor | None = None  # ...and the monitor (it needs ``on_hang``)

    def _running(self) -> Generation | None:
        gen = None if self.loop is None else self.loop.current
        if gen is None or not gen.started or gen.ended.is_set():
            return None
        return gen

    def on_hang(self, hang: Hang) -> None:
        """The monitor's timer fired: a rank missed its deadline."""
        gen = self._running()
        if gen is None:
            return
        failing = gen.failing() or any(self.reported(r) is not None for r in gen.ranks.values())
        hangs.deadline_missed(gen, hang, failing=failing, clock=self._clock, events=self._events)

    def on_straggler(self, change: Change, node: str) -> None:
        """A rank stayed slow: ``--straggler-action`` may end the generation on it."""
        gen = self._running()
        if gen is None or self.loop is None:
            return
        left = self.loop.memory.remaining(self._clock.monotonic())
        decision = straggler_decision(change, self._cfg.stragglers, left, node)
        if decision is not None:
            gen.decide_now(decision)

    async def tail(self) -> None:
        """The ranks' logs to the console, and what they say of failures, until cancelled."""
        while True:
            self._follower.poll()
            self._check()
            await self._clock.sleep(TAIL_INTERVAL)

    def _check(self) -> None:
        gen = None if self.loop is None else self.loop.current
        if gen is None or self.loop is None:
            return
        gen.check_exits(self._cfg.exit_grace, self.reported)
        job_gen = self.loop.job_gen
        done = job_gen is not None and self._job.others_done(job_gen.generation)
        gen.check_lingering(self._cfg.exit_grace, activity, other_nodes_done=done)

    def reported(self, rank: RankProcess) -> str | None:
        """How the live ``rank`` said it failed, if it did."""
        if self.monitor is not None and rank.slot.rank in self.monitor.exceptions:
            return "exception report"
        if error_file_time(rank.files.error_file) is not None:
            return "error file"
        said = self._follower.going_down(rank.slot.rank)
        return None if said is None else f"its log: {said[:400]}"
