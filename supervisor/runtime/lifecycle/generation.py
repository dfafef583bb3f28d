"""One generation: its ranks, their states, and how each of them ended."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from supervisor.clock import Clock
from supervisor.core.catalogue.ranks import RankExited, RankExitSlow, RankExitStuck, RankFailureReported
from supervisor.core.lingering import WINDOW, idle, overdue
from supervisor.core.states import GroupResult, RankState, group_result
from supervisor.core.topology import Topology
from supervisor.core.types import Decision, ExitStatus, RankExit, signal_name
from supervisor.core.watch import Hang
from supervisor.process.spawn import RankProcess
from supervisor.runtime.records.events import EventLog


class Generation:
    """The ranks of one generation.

    A generation is prepared (its ranks spawned, possibly as standbys that
    preload while the previous generation trains), then started (every rank
    gets its go), then ended by the termination procedure. ``ended`` is set
    once its result is known: every rank succeeded, or one failed.
    """

    def __init__(
        self,
        number: int,
        clock: Clock,
        events: EventLog,
        before_exit_event: Callable[[int], Mapping[Path, int]] = lambda rank: {},
        waited_of: Callable[[int], str | None] = lambda rank: None,
        *,
        witnessed_of: Callable[[int], str | None] = lambda rank: None,
    ) -> None:
        self.number = number
        self.topology = Topology(nproc_per_node=1)  # set by the launcher before any rank spawns
        self.ranks: dict[int, RankProcess] = {}
        self.exits: dict[int, RankExit] = {}
        self.hangs: dict[int, tuple[Hang, float]] = {}  # local rank -> hang, wall time of its deadline
        # the first deadline missed, and when (monotonic) it was noticed: who is hung
        # is decided from every rank's evidence afterwards (supervisor.core.blame)
        self.missed: tuple[Hang, float] | None = None
        # when (monotonic) the trouble that ended it began; None: it ended well
        self.trouble_at: float | None = None
        self.stacks: dict[int, str] = {}  # local rank -> its dumped stacks
        self.bundle: Path | None = None  # the hang's diagnostic bundle, if it hung
        # a job-wide hang's verdict (lifecycle.incident), and whether its culprits run
        # elsewhere: then this node's missed deadline only waited for them, and it follows
        self.job_blame: dict[str, Any] | None = None
        self.culprit_elsewhere = False
        self.notable: dict[int, tuple[str, ...]] = {}  # rank -> trouble-looking log lines
        self.after_exit: dict[int, tuple[str, ...]] = {}  # rank -> ...noticed after it exited
        # local rank -> when (monotonic) it reported a failure (error file, client) while alive
        self.reported: dict[int, float] = {}
        self.stuck: set[int] = set()  # reported a failure, then did not exit within the grace
        # local rank -> when (monotonic) it was found still running --exit-grace after every
        # other rank exited 0 (supervisor.core.lingering); those judged done with their work
        self.lingering: dict[int, float] = {}
        self.lingering_done: set[int] = set()
        self.other_nodes_done: float | None = None  # when this node learnt all the others' ranks exited 0
        # local rank -> (when, its CPU seconds and I/O bytes then): a lingering rank's activity
        self._activity: dict[int, tuple[float, tuple[float, int] | None]] = {}
        self._working: set[int] = set()  # lingering, but working: said once
        self.restart_requested = False  # by an operator (ft-supervisor restart)
        self.decided: Decision | None = None  # by the daemon while the ranks ran (a straggler)
        # wall-clock time the termination procedure began: anything a rank
        # recorded before then, it did on its own
        self.stop_wall: float | None = None
        self.stop_mono: float | None = None  # the same instant, on the monotonic clock
        self.ended = asyncio.Event()
        self.started = False
        self.started_at = 0.0  # monotonic
        self._clock = clock
        self._events = events
        # lets the console show a rank's last words before the news of its exit, and
        # says how far its logs went when it died (local rank -> path -> bytes)
        self._before_exit_event = before_exit_event
        self._waited_of = waited_of  # by rank: the log line saying it timed out waiting in a collective
        self._witnessed_of = witnessed_of  # by rank: the log line blaming a peer for its collective
        self.exit_offsets: dict[int, Mapping[Path, int]] = {}

    @property
    def result(self) -> GroupResult:
        missed = self.missed is not None and not self.culprit_elsewhere
        if self.hangs or self.stuck or missed:  # stopped by us, but the generation failed
            return GroupResult.FAILED
        states = {lr: r.state for lr, r in self.ranks.items()}
        if self.lingering_done and all(
            s is RankState.SUCCEEDED or lr in self.lingering_done for lr, s in states.items()
        ):
            return GroupResult.SUCCEEDED  # ended by us on its way out, its work done
        return group_result(states)

    def add(self, rank: RankProcess) -> None:
        """Add (or replace) the rank of a local rank slot; ``watch`` it next."""
        self.ranks[rank.slot.local_rank] = rank

    def start(self) -> None:
        self.started = True
        self.started_at = self._clock.monotonic()
        self._settle()

    def missed_deadline(self, hang: Hang, noticed: float) -> None:
        """A rank missed a deadline: the generation is over; which rank is hung comes next."""
        if self.missed is None:
            self.missed = (hang, noticed)
        self.ended.set()

    def waited(self) -> dict[int, str]:
        """By local rank, the ranks that said they waited in a collective past its timeout
        (NCCL's watchdog, gloo's wait: ``core.notable.says_timed_out_waiting``), as far as
        their logs were read: witnesses of a peer's trouble, which make the job's incident."""
        said = {lr: self._waited_of(r.slot.rank) for lr, r in self.ranks.items()}
        return {lr: line for lr, line in said.items() if line is not None}

    def witnessed(self) -> dict[int, str]:
        """By local rank, the ranks that blamed a peer for their collective (a size mismatch,
        a connection reset: ``core.notable.says_peer_broke``): witnesses, not culprits."""
        said = {lr: self._witnessed_of(r.slot.rank) for lr, r in self.ranks.items()}
        return {lr: line for lr, line in said.items() if line is not None}

    def hung(self, local_rank: int, hang: Hang, deadline_wall: float) -> None:
        """The evidence names this rank as hung."""
        self.hangs.setdefault(local_rank, (hang, deadline_wall))
        self.ended.set()

    def failing(self) -> bool:
        """A rank failed or said it is failing: the others wait for it, they are not hung."""
        return bool(self.reported) or any(r.state is RankState.FAILED for r in self.ranks.values())

    def trouble_began(self, ending: float, reported: Mapping[int, float]) -> float:
        """When (monotonic) the trouble that ends the generation began, at the latest
        ``ending``: intervals still open then ended because of it, and teach nothing.
        ``reported``: when ranks reported failures the daemon heard of (by rank)."""
        times = [ending, *self.reported.values(), *reported.values()]
        if self.missed is not None:
            hang, noticed = self.missed
            times.append(noticed - hang.open_for)
        times += [e.at for lr, e in self.exits.items() if self.ranks[lr].state is RankState.FAILED]
        return min(times)

    def check_exits(self, grace: float, reported: Callable[[RankProcess], str | None]) -> None:
        """A rank that reported its failure (its torchelastic error file, its client's
        exception report, or torch saying in its log that it takes the process down:
        ``reported`` says how, or None) must exit soon; one that does not (a gloo or
        NCCL teardown blocked on a peer or on the GPU, a stuck atexit handler) ends the
        generation after ``grace`` s."""
        if not self.started or self.ended.is_set():
            return
        now = self._clock.monotonic()
        for lr, rank in self.ranks.items():
            if rank.returncode is not None or rank.state is not RankState.RUNNING:
                continue
            seen = self.reported.get(lr)
            if seen is None:
                how = reported(rank)
                if how is not None:
                    self.reported[lr] = now
                    self._events.emit(RankFailureReported(generation=self.number, rank=rank.slot.rank,
                                                          pid=rank.pid, exit_grace=grace,
                                                          how=how))  # fmt: skip
            elif now - seen >= grace:
                self._events.emit(RankExitStuck(generation=self.number,
                                                after="failure_reported", rank=rank.slot.rank, pid=rank.pid,
                                                waited=round(now - seen, 3)))  # fmt: skip
                self.stuck.add(lr)
                self.ended.set()

    def check_lingering(
        self, grace: float, activity: Callable[[int], tuple[float, int] | None], *,
        other_nodes_done: bool = False,
    ) -> None:  # fmt: skip
        """A rank still running ``grace`` s after every other rank of the job exited 0,
        and doing nothing over the next ``WINDOW`` s (``activity``: a pid's CPU seconds
        and I/O bytes), ends it: stuck on its way out, or in its work (examined next).
        One that works (a final checkpoint written after its peers left) is left to
        finish. On several nodes, only once every other node said its ranks all exited
        0 (``other_nodes_done``): until then, peers elsewhere may still be training."""
        # a rank that reported its failure is check_exits' to end, and the run failed
        if not self.started or self.ended.is_set() or self.reported:
            return
        now = self._clock.monotonic()
        if self.topology.nnodes != 1:
            if not other_nodes_done:
                return
            if self.other_nodes_done is None:
                self.other_nodes_done = now
        states = {lr: r.state for lr, r in self.ranks.items()}
        exits = {lr: e.at for lr, e in self.exits.items()}
        for lr in overdue(states, exits, now, grace, self.other_nodes_done):
            rank = self.ranks[lr]
            sample = activity(rank.pid)
            began = self._activity.setdefault(lr, (now, sample))
            window = min(grace, WINDOW)
            if now - began[0] < window:
                continue
            if idle(began[1], sample, now - began[0]):
                self.lingering[lr] = now
                self.ended.set()
                continue
            self._activity[lr] = (now, sample)
            if lr not in self._working:
                self._working.add(lr)
                why = "every other rank exited 0, this one still works: left to finish"
                self._events.emit(RankExitSlow(generation=self.number, rank=rank.slot.rank, pid=rank.pid,
                                               detail=why))  # fmt: skip

    def request_restart(self) -> None:
        self.restart_requested = True
        self.ended.set()

    def decide_now(self, decision: Decision) -> None:
        """End the generation on a decision taken while its ranks ran (a straggler)."""
        if self.decided is None:
            self.decided = decision
        self.ended.set()

    async def watch(self, rank: RankProcess) -> None:
        """Wait for the rank to exit, then record how (a child watcher, no polling)."""
        returncode = await rank.proc.wait()
        rank.close_boot()
        status = ExitStatus.from_returncode(returncode)
        terminated = rank.state in (RankState.STOPPING, RankState.UNKILLABLE)
        exit = RankExit(
            local_rank=rank.slot.local_rank,
            rank=rank.slot.rank,
            pid=rank.pid,
            status=status,
            at=self._clock.monotonic(),
            at_wall=self._clock.wall(),
            terminated=terminated,
        )
        was_standby = rank.state is RankState.STANDBY
        if terminated:
            rank.move_to(RankState.STOPPED)
        elif status.succeeded and not was_standby:
            rank.move_to(RankState.SUCCEEDED)
        else:
            rank.move_to(RankState.FAILED)
        self.exits[exit.local_rank] = exit
        failed = rank.state is RankState.FAILED
        offsets = self.exit_offsets[exit.local_rank] = self._before_exit_event(exit.rank)
        self._events.emit(
            RankExited(
                generation=self.number,
                rank=exit.rank,
                local_rank=exit.local_rank,
                pid=exit.pid,
                exit_code=status.code,
                signal=None if status.signal is None else signal_name(status.signal),
                state=str(rank.state),
                standby=was_standby or None,
                # how far its logs went when it died: what follows, processes it left behind wrote
                stdout_bytes=offsets.get(rank.files.stdout),
                stderr_bytes=offsets.get(rank.files.stderr),
            ),
            logging.WARNING if failed else logging.INFO if self.started else logging.DEBUG,
        )
        self._settle()

    def _settle(self) -> None:
        if self.started and self.result is not GroupResult.RUNNING:
            self.ended.set()
