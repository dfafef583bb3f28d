"""Goodput: how much of a run's wall time trained, and where the rest went.

A ``Ledger`` is fed the daemon's events in order (``add(name, record)``: the names
and fields of ``events.jsonl`` and of the events socket, times from ``t_wall``);
``summary(now_wall)`` accounts for the run so far, so the same ledger serves the
run report afterwards and a live "goodput so far" gauge (``add`` only files the
event; the accounting happens in ``summary``). Unknown events and missing fields
are ignored: a ledger never raises on what it is fed.

Definitions (seconds of wall time):

wall
    the first ``run_started`` to the last ``run_finished``; while running, to
    ``now_wall`` (or the latest event).
stepping
    a generation is stepping once every rank spawned for it has sent
    ``rank_stepping`` (its first step); of those ranks, only the ones that ever
    report a step in the run count (a workload may report from rank 0 alone).
    A generation that ends with only some
    ranks stepping steps from the last one that did; one that ends with none, in a
    run whose ranks report steps, never stepped (all of it was downtime); in a run
    whose ranks never report steps, every generation "steps" from
    ``generation_started``: known only to have started, so the summary says
    ``steps_known`` False and claims no goodput (start-up is never productive).
    While running, a generation whose ranks have not all
    stepped is not stepping yet, except before any rank of the run ever did: then
    it counts from ``generation_started`` (a workload without steps would
    otherwise read 0).
incident
    a generation ended by a failure: a ``decision`` names it, or its result is
    ``failed``. Its cause is the reason, rule and detail of the decision that
    names the root cause best (several nodes decide, a decision may be adopted
    later): a rule for a rank's own failure, else one that blames a peer, else
    the first; its action is the last decision's, or the job's (``job_decision``).
failed at
    the earliest sign of the failure in the generation: a rank exited failed or
    reported its failure, a hang (dated at the rank's last sign of life,
    ``rank_hung.t_wall - open_for``), a peer's news, an operator's restart, a
    workload request.
detection
    failed at -> noticed (the daemon's own event): 0 for a crash, about the
    timeout for a hang.
restart
    noticed -> the next generation stepping. None when no generation followed
    and the decision was not a restart (abort, reschedule: the run ended).
recomputation
    the last checkpoint saved (``checkpoint_reported`` ``saved``, any rank, any
    generation) at or before failed at -> failed at, but never before the
    generation stepped: the work since then is done again. Without such a
    checkpoint, all of the generation's stepping time. Where the next generation
    restored from memory snapshots (``snapshot_restored``) a step newer than that
    checkpoint, the iterations since that step at the generation's own pace.
iterations lost
    the generation's last iteration minus the checkpoint's or the restored
    snapshot's (or the generation's first minus one), when ranks reported iterations.
productive
    stepping time not lost to recomputation.
goodput
    productive / wall, in [0, 1].
overhead
    wall - productive - lost: the first start-up, the end of the run, and
    downtime no incident explains (a node joining, a stop).

The intervals are disjoint (each is clamped into the generation it belongs to),
so ``productive + detection + restart + recomputation + overhead == wall``.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Mapping
from typing import Any

from supervisor.core import goodput_tally as tally
from supervisor.core.catalogue.checkpoints import CheckpointReported
from supervisor.core.catalogue.daemon import RunFinished, RunStarted
from supervisor.core.catalogue.generation import (
    Decision,
    GenerationEnded,
    GenerationStarted,
    RestartRequested,
)
from supervisor.core.catalogue.job import JobBlame, JobDecision, PeerNews
from supervisor.core.catalogue.ranks import (
    RankExited,
    RankFailureReported,
    RankHung,
    RankSpawned,
    RankStepping,
    WorkloadRequest,
)
from supervisor.core.catalogue.snapshots import SnapshotRestored
from supervisor.core.goodput_figures import Incident, Summary
from supervisor.core.goodput_tally import Tally, cause_rank, int_of, num, str_of

__all__ = ["Incident", "Ledger", "Summary"]

# the daemon's own notice of a failure, before or without a failed exit
_SIGNS = (RankFailureReported.NAME, PeerNews.NAME, RestartRequested.NAME)


class Ledger:
    """Events in, a ``Summary`` out. See the module's docstring for the definitions."""

    def __init__(self) -> None:
        self._gens: dict[int, Tally] = {}
        self._order: list[int] = []  # generations in the order they started
        self._runs_started = 0
        self._runs_finished = 0
        self._start: float | None = None
        self._end: float | None = None
        self._last: float | None = None
        self._saved_at: list[float] = []
        self._saved_iteration: list[int | None] = []
        self._stepped: set[int] = set()  # ranks that ever reported a step
        self._handlers: dict[str, Callable[[Mapping[str, Any], float], None]] = {
            RunStarted.NAME: self._run_started,
            RunFinished.NAME: self._run_finished,
            GenerationStarted.NAME: self._generation_started,
            GenerationEnded.NAME: self._generation_ended,
            RankSpawned.NAME: self._rank_spawned,
            RankStepping.NAME: self._rank_stepping,
            RankExited.NAME: self._rank_exited,
            RankHung.NAME: self._rank_hung,
            CheckpointReported.NAME: self._checkpoint,
            Decision.NAME: self._decision,
            JobDecision.NAME: self._job_decision,
            JobBlame.NAME: self._job_blame,
            WorkloadRequest.NAME: self._workload_request,
            SnapshotRestored.NAME: self._snapshot_restored,
        }
        for sign in _SIGNS:
            self._handlers[sign] = functools.partial(self._sign, sign)

    def add(self, name: str, record: Mapping[str, Any]) -> None:
        t = num(record, "t_wall")
        if t is None:
            return
        # fed in order: a clock that stepped back must not make intervals overlap
        t = t if self._last is None else max(self._last, t)
        self._last = t
        handler = self._handlers.get(name)
        if handler is not None:
            handler(record, t)

    # -- filing events --------------------------------------------------------------

    def _gen(self, record: Mapping[str, Any]) -> Tally | None:
        number = int_of(record, "generation")
        if number is None:
            return None
        gen = self._gens.get(number)
        if gen is None:
            gen = self._gens[number] = Tally(number)
        return gen

    def _run_started(self, record: Mapping[str, Any], t: float) -> None:
        self._runs_started += 1
        self._start = t if self._start is None else min(self._start, t)

    def _run_finished(self, record: Mapping[str, Any], t: float) -> None:
        self._runs_finished += 1
        self._end = t if self._end is None else max(self._end, t)

    def _generation_started(self, record: Mapping[str, Any], t: float) -> None:
        gen = self._gen(record)
        if gen is not None and gen.started is None:  # several nodes: the first to start
            gen.started = t
            self._order.append(gen.number)

    def _generation_ended(self, record: Mapping[str, Any], t: float) -> None:
        gen = self._gen(record)
        if gen is None or gen.started is None:
            return
        gen.ended = t if gen.ended is None else max(gen.ended, t)
        # "verdict": what event logs written before 2026-11 call it
        result = str_of(record, "result") or str_of(record, "verdict")
        if result is not None and gen.result != "failed":
            gen.result = result
        iteration = int_of(record, "iteration")
        if iteration is not None:
            gen.last_iteration = max(iteration, gen.last_iteration or iteration)

    def _rank_spawned(self, record: Mapping[str, Any], t: float) -> None:
        gen, rank = self._gen(record), int_of(record, "rank")
        if gen is not None and rank is not None:
            gen.spawned.add(rank)

    def _rank_stepping(self, record: Mapping[str, Any], t: float) -> None:
        gen, rank = self._gen(record), int_of(record, "rank")
        if gen is None or rank is None or gen.started is None:
            return
        gen.stepping.setdefault(rank, t)
        self._stepped.add(rank)
        iteration = int_of(record, "iteration")
        if iteration is not None:
            gen.first_iteration = min(iteration, gen.first_iteration or iteration)
            gen.last_iteration = max(iteration, gen.last_iteration or iteration)

    def _rank_exited(self, record: Mapping[str, Any], t: float) -> None:
        gen = self._gen(record)
        if gen is not None and record.get("state") == "failed" and not record.get("standby"):
            gen.mark(RankExited.NAME, t, t, int_of(record, "rank"))

    def _rank_hung(self, record: Mapping[str, Any], t: float) -> None:
        gen = self._gen(record)
        if gen is not None:
            silent = max(0.0, num(record, "open_for") or 0.0)
            gen.mark(RankHung.NAME, t - silent, t, int_of(record, "rank"))

    def _sign(self, name: str, record: Mapping[str, Any], t: float) -> None:
        gen = self._gen(record)
        if gen is not None:
            gen.mark(name, t, t, int_of(record, "rank"))

    def _workload_request(self, record: Mapping[str, Any], t: float) -> None:
        gen = self._gen(record)
        if gen is not None and record.get("action") not in (None, "continue"):
            gen.mark(WorkloadRequest.NAME, t, t, int_of(record, "rank"))

    def _snapshot_restored(self, record: Mapping[str, Any], t: float) -> None:
        found = tally.restored_from_memory(record)
        before = None if found is None else self._gens.get(found[0])
        if found is not None and before is not None:  # every rank restores the same step
            before.restored = found[1] if before.restored is None else min(before.restored, found[1])

    def _checkpoint(self, record: Mapping[str, Any], t: float) -> None:
        if record.get("checkpoint") != "saved":
            return
        iteration = int_of(record, "iteration")
        at = bisect.bisect_right(self._saved_at, t)  # merged nodes may be a little out of order
        self._saved_at.insert(at, t)
        self._saved_iteration.insert(at, iteration)
        gen = self._gen(record)
        if gen is not None and iteration is not None:
            gen.last_iteration = max(iteration, gen.last_iteration or iteration)

    def _decision(self, record: Mapping[str, Any], t: float) -> None:
        gen = self._gen(record)
        if gen is None or gen.started is None:
            return
        gen.action = str_of(record, "action")
        rank = cause_rank(record)
        if not gen.decided or rank > gen.cause_rank:
            gen.cause_rank = rank
            gen.reason = str_of(record, "reason")
            gen.rule = str_of(record, "rule")
            gen.detail = str_of(record, "detail") or ""
            gen.blamed = int_of(record, "rank")
        gen.decided = True
        if gen.failed_at is None:  # nothing failed here: the decision is the first sign
            gen.failed_at = gen.noticed_at = max(gen.started, min(t, gen.ended or t))
            gen.sign = Decision.NAME

    def _job_blame(self, record: Mapping[str, Any], t: float) -> None:
        """A hang across the job: its culprit is the incident's rank on every node."""
        gen = self._gen(record)
        ranks, nodes = record.get("ranks"), record.get("nodes")
        if gen is None or not isinstance(ranks, list) or not ranks or not isinstance(ranks[0], int):
            return
        node = nodes[0] if isinstance(nodes, list) and nodes and isinstance(nodes[0], int) else None
        gen.culprit = (ranks[0], node, str_of(record, "rule") or "")

    def _job_decision(self, record: Mapping[str, Any], t: float) -> None:
        gen = self._gen(record)
        if gen is not None and gen.decided and str_of(record, "action") is not None:
            gen.action = str_of(record, "action")

    # -- accounting -------------------------------------------------------------------

    def summary(self, now_wall: float | None = None) -> Summary:
        finished = self._runs_started > 0 and self._runs_finished >= self._runs_started
        start = self._start
        if start is None and self._order:
            start = self._gens[self._order[0]].started
        end = self._end if finished else (now_wall if now_wall is not None else self._last)
        if end is not None and self._last is not None:
            end = max(end, self._last)
        if start is None or end is None:  # nothing started yet
            n = len(self._order)
            return Summary(start, None, finished, 0.0, 0.0, 0.0, 0.0, 0.0, max(0, n - 1), n, 0, None,
                           steps_known=bool(self._stepped))  # fmt: skip
        gens = [self._gens[n] for n in self._order]
        productive = detection = restart = recomputation = 0.0
        incidents: list[Incident] = []
        first_step: float | None = None
        for i, gen in enumerate(gens):
            after = gens[i + 1] if i + 1 < len(gens) else None
            # several nodes: the slowest may end a generation after the next began
            gen_end = self._gen_end(gen, end if after is None or after.started is None else after.started)
            stepping = self._stepping_at(gen, gen_end)
            if i == 0:
                first_step = stepping
            if gen.failing:
                incident = self._incident(gen, after, stepping, end)
                incidents.append(incident)
                stepped = incident.failed_at if stepping is None else stepping
                productive += max(0.0, incident.failed_at - incident.recomputation - stepped)
                detection += incident.detection
                restart += incident.restart or 0.0
                recomputation += incident.recomputation
            elif stepping is not None:
                productive += max(0.0, gen_end - stepping)
        wall = end - start
        return Summary(
            started_at=start,
            ended_at=end,
            finished=finished,
            wall=wall,
            productive=productive,
            detection=detection,
            restart=restart,
            recomputation=recomputation,
            restarts=max(0, len(gens) - 1),
            generations=len(gens),
            checkpoints=len(self._saved_at),
            last_iteration=max(
                (g.last_iteration for g in gens if g.last_iteration is not None), default=None
            ),
            incidents=tuple(incidents),
            stepping_at=first_step,
            steps_known=bool(self._stepped),
        )

    @staticmethod
    def _gen_end(gen: Tally, end: float) -> float:
        started = gen.started if gen.started is not None else end
        return min(end, max(started, gen.ended if gen.ended is not None else end))

    def _stepping_at(self, gen: Tally, gen_end: float) -> float | None:
        """When the generation's ranks were all stepping (the definitions above); None: not yet."""
        started = gen.started if gen.started is not None else gen_end
        limit = gen_end if gen.failed_at is None else min(gen_end, gen.failed_at)
        expected = gen.spawned & self._stepped if self._stepped else set()
        if not expected:  # nobody steps yet, or none of these ranks did before: all of them
            expected = gen.spawned or set(gen.stepping)
        if gen.stepping and expected <= gen.stepping.keys():
            at = max(gen.stepping[r] for r in expected)
        elif gen.ended is None and gen.failed_at is None:
            if self._stepped:
                return None  # still starting
            at = started  # nobody ever stepped: assume it is training
        elif gen.stepping:
            at = max(gen.stepping.values())
        else:
            at = limit if self._stepped else started
        return min(max(at, started), limit)

    def _incident(self, gen: Tally, after: Tally | None, stepping: float | None, end: float) -> Incident:
        started = gen.started if gen.started is not None else end
        failed = gen.failed_at if gen.failed_at is not None else self._gen_end(gen, end)
        noticed = max(failed, gen.noticed_at if gen.noticed_at is not None else failed)
        stepped = stepping if stepping is not None else failed
        ckpt_at, ckpt_iteration = self._checkpoint_before(failed)
        anchor = stepped if ckpt_at is None else min(failed, max(stepped, ckpt_at))
        restart: float | None = None
        if after is not None:
            after_end = self._gen_end(after, end)
            next_step = self._stepping_at(after, after_end)
            restart = (next_step if next_step is not None else end) - noticed
        elif gen.action in (None, "restart"):
            restart = end - noticed  # on its way back
        # from the checkpoint's iteration, or the generation's first (it started over)
        first = None if gen.first_iteration is None else gen.first_iteration - 1
        base = max((b for b in (ckpt_iteration, first) if b is not None), default=None)
        last = gen.last_iteration
        lost_iterations = None if last is None or base is None else max(0, last - base)
        recomputation = max(0.0, failed - max(anchor, started))
        redone = tally.redone_since_snapshot(gen, failed, stepped)  # memory snapshots: newer than a save
        if redone is not None and (lost_iterations is None or redone[1] <= lost_iterations):
            recomputation, lost_iterations = min(recomputation, redone[0]), redone[1]
        return Incident(
            generation=gen.number,
            action=gen.action,
            reason=gen.reason,
            rule=gen.rule,
            detail=gen.detail,
            rank=gen.culprit[0] if gen.culprit else gen.blamed if gen.blamed is not None else gen.sign_rank,
            sign=gen.sign or GenerationEnded.NAME,
            failed_at=failed,
            noticed_at=noticed,
            detection=noticed - failed,
            restart=None if restart is None else max(0.0, restart),
            recomputation=recomputation,
            checkpoint_at=ckpt_at if ckpt_at is not None and ckpt_at >= stepped else None,
            iterations_lost=lost_iterations,
            node=gen.culprit[1] if gen.culprit else None,
            blame=gen.culprit[2] if gen.culprit else None,
        )

    def _checkpoint_before(self, t: float) -> tuple[float | None, int | None]:
        at = bisect.bisect_right(self._saved_at, t)
        if at == 0:
            return None, None
        return self._saved_at[at - 1], self._saved_iteration[at - 1]
