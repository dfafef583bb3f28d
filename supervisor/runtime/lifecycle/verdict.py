"""What follows a generation on this node: the route its end takes (it succeeded, it
is judged on its evidence, or it is decided without evidence: a peer's news, an
operator's restart, a decision taken while it ran), the kernel's lines that join the
evidence, and the node's health ledger, which may turn a restart into this node's
leaving (--node-quarantine) or keep the node from starting at all."""

from __future__ import annotations

import logging
from collections.abc import Callable

from supervisor.clock import Clock
from supervisor.config.run import RunConfig
from supervisor.core.evidence import WorkloadRequest
from supervisor.core.jobwide import PeerNews
from supervisor.core.kmsg import about
from supervisor.core.next_step import GenerationEnd, Route, route, without_evidence
from supervisor.core.states import GroupResult
from supervisor.core.types import Decision
from supervisor.process.spawn import RankProcess
from supervisor.process.terminate import TerminationReport
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.judge import Judge
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.records.health import NodeHealth
from supervisor.runtime.records.rundir import RunDir
from supervisor.runtime.services.kernellog import KernelLog

KERNEL_SLACK = 1.0  # seconds before a generation's start whose kernel lines are its evidence too


class Verdict:
    def __init__(
        self, cfg: RunConfig, *, judge: Judge, monitor: Monitor, kernel: KernelLog, health: NodeHealth,
        events: EventLog, clock: Clock, logger: logging.Logger, rundir: RunDir,
    ) -> None:  # fmt: skip
        self._cfg, self._judge, self._monitor, self._kernel = cfg, judge, monitor, kernel
        self._health, self._events, self._clock = health, events, clock
        self._logger, self._rundir = logger, rundir

    async def decide(
        self, gen: Generation, report: TerminationReport, news: tuple[PeerNews, str] | None,
        reported: Callable[[RankProcess], str | None],
    ) -> Decision | None:  # fmt: skip
        """What follows the generation on this node; None when it simply succeeded.
        ``reported``: whether a rank reported its failure while alive."""
        requests = tuple(
            WorkloadRequest(r.rank, str(r.action), r.reason)
            for r in self._monitor.requests
            if r.action != "continue"
        )
        end = GenerationEnd(
            succeeded=gen.result is GroupResult.SUCCEEDED,
            failed=gen.result is GroupResult.FAILED,
            restart_requested=gen.restart_requested,
            unkillable=report.unkillable,
            requests=requests,
            peer_news=None if news is None else news[0],
            reported=any(reported(r) is not None for r in gen.ranks.values()),
            decided=gen.decided,
        )
        way = route(end)
        if way is Route.SUCCEEDED:
            return None
        if way is Route.JUDGE:
            kernel = self.kernel_lines(gen)
            if kernel:  # for ft-supervisor classify, which judges the run again
                self._events.emit("kernel_lines", generation=gen.number, lines=list(kernel), quiet=("lines",))
            return await self._judge.judge(gen, self._monitor, report.unkillable, requests, dmesg=kernel)
        detail = "" if news is None else news[1]
        decision = without_evidence(way, end.peer_news, self._judge.budget, self._clock.monotonic(), detail,
                                    decided=gen.decided)  # fmt: skip
        return self._judge.without_evidence(gen.number, decision)

    def kernel_lines(self, gen: Generation) -> tuple[str, ...]:
        """The kernel's lines since the generation started that may be about it."""
        if not gen.started:
            return ()
        ranks = gen.ranks.values()
        cgroups = {str(r.containment.cgroup) for r in ranks if r.containment.cgroup is not None}
        return about(self._kernel.since(gen.started_at - KERNEL_SLACK), {r.pid for r in ranks}, cgroups)

    async def refused_at_start(self) -> int | None:
        """A quarantined node starts no rank of this run: its exit code, or None."""
        refused = await self._health.at_start()
        if refused is None:
            return None
        self._judge.adopt(refused, 0)
        self._judge.report(refused, self._logger, self._rundir.root)
        return self._cfg.policy.exit_codes.of(refused.action)

    async def mark_health(self, decision: Decision, generation: int) -> Decision:
        """The node's ledger records a hardware-looking failure; one too many, and a
        restart becomes this node's leaving (--node-quarantine)."""
        c = self._judge.classification
        nature, rule = (None, None) if c is None else (c.nature, c.rule)
        screened = await self._health.after(decision, nature, rule, generation)
        if screened is not decision:
            self._judge.adopt(screened, generation)
        return screened
