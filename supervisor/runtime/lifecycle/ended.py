"""A generation once its ranks are down, as one frozen value.

Everything the decision needs is copied out of the live ``Generation`` and the
monitor the moment the termination procedure returns: how each rank ended, what
it reported, its stacks and log lines, what the ranks asked for, what a peer or
an operator said, and when the trouble began. The stages that follow
(``deciding``) read this value only; nothing they return is written back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.core.evidence import WorkloadRequest
from supervisor.core.jobwide import PeerNews
from supervisor.core.states import GroupResult, RankState
from supervisor.core.types import Decision, RankExit, ReportedException
from supervisor.core.watch import Hang
from supervisor.process.spawn import RankFiles, RankProcess
from supervisor.process.terminate import TerminationReport
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.monitor import Monitor


@dataclass(frozen=True, slots=True)
class RankEnd:
    """One rank of an ended generation: how it ended and what it left."""

    local_rank: int
    rank: int
    pid: int
    state: RankState
    exit: RankExit | None  # None: it outlived SIGKILL
    files: RankFiles
    stderr_bytes: int | None  # how far its stderr went when it exited
    hang: tuple[Hang, float] | None  # named hung: the hang, wall time of its deadline
    reported_at: float | None  # when (monotonic) it said it failed while alive (error file, log)
    exception: ReportedException | None  # its client's exception report
    exception_at: float | None
    stacks: str  # its dumped stacks, if it was asked for them
    notable: tuple[str, ...]  # trouble-looking lines of its log
    after_exit: tuple[str, ...]  # ...written after it exited (by processes it left behind)
    progressed: bool | None  # completed a step this generation; None: it never said (no client)
    cgroup: Path | None


@dataclass(frozen=True, slots=True)
class GenerationEnded:
    """How a generation ended on this node."""

    number: int
    result: GroupResult
    started: bool
    started_at: float  # monotonic
    stop_wall: float | None  # when the termination procedure began (wall clock)
    stop_mono: float | None
    trouble_at: float | None  # when the trouble that ended it began; None: it ended well
    ranks: tuple[RankEnd, ...]
    unkillable: tuple[int, ...]  # local ranks that outlived SIGKILL
    restart_requested: bool  # by an operator
    decided: Decision | None  # by the daemon while the ranks ran (a straggler, a lingering rank)
    requests: tuple[WorkloadRequest, ...]  # what the ranks asked for, beyond continuing
    reported: bool  # a rank said it failed while it was alive
    news: tuple[PeerNews, str] | None  # a peer's news that ended it, with its detail
    iterations: tuple[int, ...]  # the last iteration each rank reported
    saved: bool  # a rank saved a checkpoint this generation
    bundle: Path | None  # the hang's (or the lingering rank's) diagnostic bundle
    job_blame: dict[str, Any] | None = None  # a job-wide hang's verdict (core.job_verdict.reason_fields)
    blamed_elsewhere: bool = False  # that verdict names another node's rank

    @property
    def succeeded(self) -> bool:
        return self.result is GroupResult.SUCCEEDED

    def pids(self) -> set[int]:
        return {r.pid for r in self.ranks}

    def cgroups(self) -> set[str]:
        return {str(r.cgroup) for r in self.ranks if r.cgroup is not None}


def freeze(
    gen: Generation,
    monitor: Monitor,
    report: TerminationReport,
    *,
    news: tuple[PeerNews, str] | None,
    reported: Callable[[RankProcess], str | None],
) -> GenerationEnded:
    """The value of ``gen`` now that its ranks are down (``report``: how they were stopped)."""
    ranks = tuple(_rank_end(gen, monitor, lr, r) for lr, r in sorted(gen.ranks.items()))
    requests = tuple(
        WorkloadRequest(r.rank, str(r.action), r.reason) for r in monitor.requests if r.action != "continue"
    )
    return GenerationEnded(
        number=gen.number,
        result=gen.result,
        started=gen.started,
        started_at=gen.started_at,
        stop_wall=gen.stop_wall,
        stop_mono=gen.stop_mono,
        trouble_at=gen.trouble_at,
        ranks=ranks,
        unkillable=report.unkillable,
        restart_requested=gen.restart_requested,
        decided=gen.decided,
        requests=requests,
        reported=any(reported(r) is not None for r in gen.ranks.values()),
        news=news,
        iterations=tuple(monitor.iterations()),
        saved=monitor.saved(),
        bundle=gen.bundle,
        job_blame=gen.job_blame,
        blamed_elsewhere=gen.culprit_elsewhere,
    )


def _rank_end(gen: Generation, monitor: Monitor, lr: int, r: RankProcess) -> RankEnd:
    rank = r.slot.rank
    offsets: Mapping[Path, int] = gen.exit_offsets.get(lr, {})
    return RankEnd(
        local_rank=lr,
        rank=rank,
        pid=r.pid,
        state=r.state,
        exit=gen.exits.get(lr),
        files=r.files,
        stderr_bytes=offsets.get(r.files.stderr),
        hang=gen.hangs.get(lr),
        reported_at=gen.reported.get(lr),
        exception=monitor.exceptions.get(rank),
        exception_at=monitor.exception_at.get(rank),
        stacks=gen.stacks.get(lr, ""),
        notable=gen.notable.get(rank, ()),
        after_exit=gen.after_exit.get(rank, ()),
        progressed=monitor.progressed(rank),
        cgroup=r.containment.cgroup,
    )
