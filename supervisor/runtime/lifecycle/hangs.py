"""A missed deadline: notice it at once, then name the hung rank from every rank's evidence.

Noticing is the monitor's timer (``deadline_missed``, with how late it was
noticed). Naming waits for the stacks of every live rank, dumped at once (they
are wanted in the logs anyway, before the kill), and the pure
``supervisor.core.blame`` picks the stuck rank(s): one ``rank_hung`` event each,
saying which evidence decided, whose deadline was missed and who was waiting.
In a job of several nodes the job's blame (``lifecycle.incident``) stands for the
node's: what ``collect`` gathered is summarised and exchanged first, and only the
job's culprits that run here are named (``JobWide``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from supervisor.clock import Clock
from supervisor.core.blame import Blame, blame
from supervisor.core.catalogue.ranks import DeadlineIgnored, DeadlineMissed, RankHung
from supervisor.core.stacks import Reading
from supervisor.core.watch import Hang
from supervisor.process.terminate import Signaller
from supervisor.runtime.lifecycle import aftermath, bundle
from supervisor.runtime.lifecycle.aftermath import Seen
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.records.events import EventLog


def deadline_missed(gen: Generation, hang: Hang, *, failing: bool, clock: Clock, events: EventLog) -> None:
    """The monitor's timer fired for ``hang.rank``."""
    fields: dict[str, Any] = {
        "generation": gen.number, "rank": hang.rank, "kind": str(hang.kind), "section": hang.section,
        "open_for": round(hang.open_for, 3), "timeout": hang.timeout, "late_by": round(hang.late_by, 6),
    }  # fmt: skip
    if failing:
        # a rank already failed: the others wait for it, and its exit (or the exit
        # grace) ends the generation; waiting on a failed peer is not a new hang
        events.emit(DeadlineIgnored(why="a rank of the generation already failed", **fields))
        return
    events.emit(DeadlineMissed(**fields))
    gen.missed_deadline(hang, clock.monotonic())


READ_BOUND = bundle.SUMMARY_TIMEOUT  # seconds the dumps' reading may add to the gather


@dataclass
class Collected:
    """What was taken from the live ranks before the kill, by local rank."""

    seen: dict[int, Seen]  # their last signs of life, as of the notice
    readings: dict[int, Reading | None]  # where their stacks stand
    got: bundle.Gathered  # native stacks, Flight Recorder dumps
    summaries: bundle.Flights  # the dumps, summarised
    dumps: bundle.Dumps  # the dumps as read
    stopped: frozenset[int] = frozenset()  # found stopped before anything was gathered
    natives: asyncio.Future[bundle.Natives] | None = None  # py-spy's, still under way
    seconds: float = 0.0  # what the blame waited for: the stacks, the dumps, their reading

    async def complete(self) -> bundle.Gathered:
        """Everything gathered, py-spy's native stacks included (within its bound)."""
        if self.natives is not None:
            self.got = bundle.with_natives(self.got, await self.natives)
            self.natives = None
        return self.got

    async def drop(self) -> None:
        """No bundle after all: py-spy, if still running, is ended."""
        if self.natives is not None:
            self.natives.cancel()
            await asyncio.gather(self.natives, return_exceptions=True)
            self.natives = None


async def collect(
    gen: Generation, monitor: Monitor, *, noticed: float, stack_timeout: float, bundle_timeout: float,
    clock: Clock, events: EventLog, signals: Signaller,
) -> Collected:  # fmt: skip
    """Every live rank's stacks and Flight Recorder dump, all at once, within their bounds;
    then its native stacks, for the bundle alone (``Collected.natives``): the blame does not
    wait for py-spy. A rank found stopped is recorded so first, and nothing gathered wakes it."""
    began = clock.monotonic()
    stopped = aftermath.stopped_now(gen, signals)
    seen = aftermath.seen_now(gen, monitor, noticed)  # what each rank last said, as of the notice
    stacks = aftermath.collect_stacks(gen, monitor, stack_timeout, events, signals=signals, clock=clock,
                                      stopped=stopped)  # fmt: skip
    readings, got = await asyncio.gather(stacks, bundle.gather_flights(gen, bundle_timeout, stopped))
    # py-spy only now, beside the exchange: its symbol reading (seconds of CPU a torch rank) took
    # the CPU the ranks' dumps needed (dumps of 1.5 to 3 s beside it on a loaded machine, 0.2 s alone)
    natives = asyncio.ensure_future(bundle.gather_natives(gen, bundle_timeout, stopped))
    summaries, dumps = await bundle.flights(got)  # the recorder's account of who issued which collective
    return Collected(seen, readings, got, summaries, dumps, stopped, natives, clock.monotonic() - began)


@dataclass(frozen=True, slots=True)
class JobWide:
    """A job-wide hang's verdict, as this node applies it (``lifecycle.incident``)."""

    found: Blame  # the job's culprits that run here (none: they run elsewhere)
    document: dict[str, Any]  # every node's summary and the verdict, for job-blame.json


async def name_hung(
    gen: Generation, monitor: Monitor, *, stack_timeout: float, bundle_timeout: float, clock: Clock,
    events: EventLog, signals: Signaller, collected: Collected | None = None, job: JobWide | None = None,
) -> Blame | None:  # fmt: skip
    """Dump every live rank's stacks, blame the stuck rank(s), record them as hung,
    and leave the hang's diagnostic bundle (``supervisor.runtime.lifecycle.bundle``).
    With ``job``, the job's blame stands for this node's: only its culprits here are hung,
    and the bundle is written even where no deadline was missed here (the node took part
    on a rank's timeout, or on the news): every node's evidence stays in its run directory."""
    if gen.missed is None and (job is None or collected is None):
        if collected is not None:
            await collected.drop()
        return None
    if gen.missed is None:  # no deadline here: nobody here is named (job.found names no rank)
        assert collected is not None and job is not None
        got = await collected.complete()
        gen.bundle = await bundle.write(gen, monitor, missed=None, found=job.found, seen=collected.seen,
                                        readings=collected.readings, got=got, summaries=collected.summaries,
                                        noticed=clock.monotonic(), clock=clock, events=events,
                                        job=job.document)  # fmt: skip
        return job.found
    missed, noticed = gen.missed
    c = collected or await collect(gen, monitor, noticed=noticed, stack_timeout=stack_timeout,
                                   bundle_timeout=bundle_timeout, clock=clock, events=events,
                                   signals=signals)  # fmt: skip
    seen, readings = c.seen, c.readings
    if job is not None:
        found = job.found
    else:
        suspects = aftermath.suspects(seen, readings, bundle.enqueued_by_rank(c.summaries))
        found = blame(suspects, missed, noticed)
    local = {s.rank: lr for lr, s in seen.items()}
    deadline_wall = clock.wall() - (clock.monotonic() - (noticed - missed.late_by))
    for rank in found.ranks:
        interval = seen[local[rank]].interval if rank in local else None
        own = interval or missed
        hang = Hang(
            rank, own.kind, own.section, own.timeout, own.open_for, missed.late_by,
            deadline_rank=missed.rank, evidence=f"{found.by}: {found.detail}",
        )  # fmt: skip
        events.emit(
            RankHung(
                generation=gen.number,
                rank=rank,
                kind=str(hang.kind),
                section=hang.section,
                open_for=round(hang.open_for, 3),
                timeout=hang.timeout,
                late_by=round(missed.late_by, 6),
                deadline_rank=missed.rank,
                blamed_by=found.by,
                undetermined=found.undetermined or None,
                waiting=list(found.waiting) or None,
                evidence=found.detail,
            ),
        )
        if rank in local:
            gen.hung(local[rank], hang, deadline_wall)
    got = await c.complete()
    gen.bundle = await bundle.write(gen, monitor, missed=missed, found=found, seen=seen, readings=readings,
                                    got=got, summaries=c.summaries, noticed=noticed, clock=clock,
                                    events=events, job=None if job is None else job.document)  # fmt: skip
    return found
