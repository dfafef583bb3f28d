"""A hang across the job: every node's evidence, one blame, the same on every node.

A node that misses a deadline, or one of whose ranks said it timed out waiting in a
collective (NCCL's watchdog, gloo's wait: a witness of a peer's trouble, whose own
failure is the incident's symptom), declares an incident in the round's store before it
announces its generation's end (``declare``); every node that ends on that news, or
on its own, then ``examine`` s, before the kill: it gathers its ranks'
stacks and Flight Recorder dumps (``hangs.collect``, within the bundle's bounds),
publishes its ``NodeSummary`` and, bounded (``coord.incidents.WAIT``), reads every
node's (``coord.incidents.exchange``: the same set on every node). The pure
``core.job_blame`` names the culprit ranks and nodes; this node applies the verdict
(``core.job_verdict``): its culprits are named hung (the bundle gains job-blame.json);
a node without any follows the job as it would a peer's news, naming the culprit.
The verdict goes to reason.json (``Generation.job_blame``) and a ``job_blame`` event.
"""

from __future__ import annotations

import contextlib
from typing import Any

from supervisor.clock import Clock
from supervisor.config.ft import FtConfig
from supervisor.coord import incidents
from supervisor.coord.incidents import Board
from supervisor.coord.local import JobGeneration, JobOver
from supervisor.core import job_verdict
from supervisor.core.blame import Blame
from supervisor.core.catalogue.job import JobBlame as JobBlameEvent
from supervisor.core.job_blame import JobBlame, job_blame
from supervisor.core.job_blame import to_json as verdict_json
from supervisor.core.jobwide import PeerNews
from supervisor.core.node_summary import RankEvidence, decode, encode, summarize_node
from supervisor.core.node_summary import to_json as summary_json
from supervisor.core.notable import says_mismatch
from supervisor.core.watch import Hang, HangKind
from supervisor.process.terminate import Signaller
from supervisor.runtime.lifecycle import hangs
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.records.events import EventLog

News = tuple[PeerNews, str]


async def declare(board: Board | None, job_gen: JobGeneration, gen: Generation, clock: Clock) -> None:
    """This node's hang, or its rank's collective timeout, is the job's incident (before
    the end is announced)."""
    if board is not None and _trouble(gen):
        with contextlib.suppress(JobOver):  # the store is gone: the announcement says so next
            await incidents.declare(board, job_gen.node_rank, clock.wall())


async def examine(
    gen: Generation, monitor: Monitor, board: Board | None, job_gen: JobGeneration, *, news: News | None,
    node: str, ft: FtConfig, clock: Clock, events: EventLog, signals: Signaller,
) -> tuple[bool, News | None]:  # fmt: skip
    """Take part in the round's incident, if there is one: (whether this node took part,
    the news it follows when the culprits run elsewhere)."""
    declared_at = await _declared(board, job_gen, gen, news, clock)
    if board is None or declared_at is None:
        return False, None
    noticed = gen.missed[1] if gen.missed is not None else clock.monotonic()
    collected = await hangs.collect(gen, monitor, noticed=noticed, stack_timeout=ft.stack_dump_timeout,
                                    bundle_timeout=ft.bundle_timeout, clock=clock, events=events,
                                    signals=signals)  # fmt: skip
    try:
        return True, await _judge(gen, monitor, board, job_gen, collected, declared_at=declared_at,
                                  noticed=noticed, node=node, ft=ft, clock=clock, events=events,
                                  signals=signals)  # fmt: skip
    finally:
        await collected.drop()  # py-spy, where no bundle was written after all


async def _judge(
    gen: Generation, monitor: Monitor, board: Board, job_gen: JobGeneration, collected: hangs.Collected, *,
    declared_at: float, noticed: float, node: str, ft: FtConfig, clock: Clock, events: EventLog,
    signals: Signaller,
) -> News | None:  # fmt: skip
    """Publish, exchange, judge and apply: the news this node follows, if the culprits run elsewhere."""

    async def name_hung(job: hangs.JobWide | None) -> None:
        await hangs.name_hung(gen, monitor, stack_timeout=ft.stack_dump_timeout,
                              bundle_timeout=ft.bundle_timeout, clock=clock, events=events,
                              signals=signals, collected=collected, job=job)  # fmt: skip

    summary = summarize_node(job_gen.node_rank, node, f"generation {gen.number}", gen.number,
                             _evidence(gen, collected, declared_at))  # fmt: skip
    published = clock.monotonic()
    try:
        got = await incidents.exchange(board, job_gen.node_rank, job_gen.nnodes, encode(summary),
                                       wait=_wait(ft, declared_at, clock))  # fmt: skip
    except JobOver:
        await name_hung(None)
        return None
    summaries = [s for s in map(decode, got.values()) if s is not None]
    expected = job_verdict.expected_nodes(job_gen.nnodes, gen.topology.nproc_per_node)
    verdict = job_blame(summaries, expected)
    hosts = {s.node_rank: s.node for s in summaries}
    events.emit(
        JobBlameEvent(
            generation=gen.number, rule=verdict.rule, ranks=list(verdict.ranks), nodes=list(verdict.nodes),
            silent=list(verdict.silent), waiting=list(verdict.waiting), detail=verdict.detail,
            mismatch=verdict_json(verdict)["mismatch"], summaries=sorted(s.node_rank for s in summaries),
            seconds=round(clock.wall() - declared_at, 3), gathered=round(collected.seconds, 3),
            exchanged=round(clock.monotonic() - published, 3),
        )
    )  # fmt: skip
    ordered = sorted(summaries, key=lambda s: s.node_rank)
    document = {"generation": gen.number, "node_rank": job_gen.node_rank, "verdict": verdict_json(verdict),
                "summaries": [summary_json(s) for s in ordered]}  # fmt: skip

    if verdict.undetermined:  # nobody named: each node keeps its own blame
        await name_hung(None)
        return None
    gen.job_blame = job_verdict.reason_fields(verdict)
    local = {r.slot.rank: lr for lr, r in gen.ranks.items()}
    here = job_verdict.culprits_here(verdict, local)
    found = _found(verdict, here, local)
    if here and gen.missed is None:  # its culprit opened no deadline of its own: the job's stands for it
        seen = collected.seen.get(local[here[0]])
        hang = seen.interval if seen is not None and seen.interval is not None else None
        gen.missed_deadline(hang or Hang(here[0], HangKind.HEARTBEAT, None, None, 0.0, 0.0), noticed)
    await name_hung(hangs.JobWide(found, document))
    if here:
        return None
    gen.culprit_elsewhere = True
    return PeerNews.ENDED, job_verdict.followed(verdict, hosts)


async def _declared(
    board: Board | None, job_gen: JobGeneration, gen: Generation, news: News | None, clock: Clock
) -> float | None:
    """When the round's incident was first declared; None: this end is no hang's (or
    the store is gone: this node then judges alone, and the job's end comes next)."""
    heard = news is not None and news[0] is PeerNews.ENDED
    # a rank here blamed a peer (a reset as the desync's catcher went down): the job's incident,
    # if one is declared already, is what ended it, news or not
    if board is None or (not _trouble(gen) and not heard and not gen.witnessed()):
        return None
    await declare(board, job_gen, gen, clock)
    try:
        return await incidents.declared(board)
    except JobOver:
        return None


def _trouble(gen: Generation) -> bool:
    """What makes this node declare: a missed deadline, a rank's collective timeout, or a
    rank that caught a collective mismatch (gloo aborts the rank whose receive caught it:
    a desync, which only every node's dumps can pin on a rank)."""
    return gen.missed is not None or bool(gen.waited()) or any(map(says_mismatch, gen.witnessed().values()))


def _wait(ft: FtConfig, declared_at: float, clock: Clock) -> float:
    """How long this node waits for the others' summaries: until every node may have
    gathered its own (the bundle's bound, counted from the first declaration) and
    ``incidents.WAIT`` more, and never less than that: a node still gathering within
    its bound is not taken for a silent one (its healthy ranks would be blamed)."""
    gathered_by = declared_at + max(ft.stack_dump_timeout, ft.bundle_timeout) + hangs.READ_BOUND
    return max(incidents.WAIT, gathered_by + incidents.WAIT - clock.wall())


def _found(verdict: JobBlame, here: tuple[int, ...], local: dict[int, int]) -> Blame:
    waiting = tuple(r for r in verdict.waiting if r in local)
    detail = f"{verdict.rule}: {job_verdict.named(verdict)}: {verdict.detail}"
    return Blame(here, "job_blame", waiting, detail)


def _evidence(gen: Generation, c: hangs.Collected, declared_at: float) -> list[RankEvidence]:
    """Each rank as gathered: its stacks and dump if it lived then; if it has exited, whether
    after the incident was declared (because of it); its own word if it timed out waiting."""
    out, waited, witnessed = [], gen.waited(), gen.witnessed()
    for lr, r in sorted(gen.ranks.items()):
        gone = r.returncode is not None
        exit = gen.exits.get(lr)
        after = gone and (exit is None or exit.at_wall >= declared_at)
        dump: Any = None
        dump, why = c.dumps.get(lr, (None, c.got.flight.get(lr, (None, None))[1]))
        seen = c.seen.get(lr)
        out.append(RankEvidence(r.slot.rank, dump=dump, dump_error=why, reading=c.readings.get(lr),
                                iteration=None if seen is None else seen.iteration, gone=gone, after=after,
                                waited=waited.get(lr), witness=witnessed.get(lr)))  # fmt: skip
    return out
