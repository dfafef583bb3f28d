"""After a generation ends: its ranks' stacks (if one hung) and the evidence."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, replace

from supervisor.clock import Clock
from supervisor.core.blame import Suspect
from supervisor.core.catalogue.ranks import StacksDumped
from supervisor.core.errorfile import order_failures
from supervisor.core.evidence import Part, part_of
from supervisor.core.stacks import Reading, Where, read
from supervisor.core.states import RankState
from supervisor.core.types import RankFailure
from supervisor.core.watch import Hang
from supervisor.process.evidence import failure_evidence
from supervisor.process.stacks import dump_stacks
from supervisor.process.stacks import stopped as is_stopped
from supervisor.process.terminate import Signaller
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.records.events import EventLog


def stopped_now(gen: Generation, signals: Signaller) -> frozenset[int]:
    """The live ranks found stopped (SIGSTOP, a debugger), by local rank: read before
    anything is sent to them, and never woken for evidence (``process.stacks``)."""
    return frozenset(
        lr for lr, r in gen.ranks.items() if r.returncode is None and is_stopped(signals.state(r.pid))
    )


async def collect_stacks(
    gen: Generation, monitor: Monitor, timeout: float, events: EventLog, *, signals: Signaller, clock: Clock,
    stopped: frozenset[int] | None = None,
) -> dict[int, Reading | None]:  # fmt: skip
    """Every live rank's stacks into its log, before the kill: all at once, since
    this is on the critical path of the restart. Where each rank stands, by local
    rank: what it was doing (its main thread), stopped, or silent (no answer); None
    for a rank that cannot dump its stacks (no client). ``stopped``: the ranks found
    stopped before anything was gathered (else read here); they are not asked."""
    live = [r for r in gen.ranks.values() if r.returncode is None]
    if stopped is None:
        stopped = stopped_now(gen, signals)
    asked = [r for r in live if r.slot.local_rank not in stopped]
    ranks = [r for r in asked if monitor.stack_signals.get(r.slot.rank) is not None]
    signal_of = monitor.stack_signals
    dumps = [
        dump_stacks(r.pid, signal_of[r.slot.rank], r.files.stderr, timeout, signals=signals, clock=clock)
        for r in ranks
    ]
    texts = await asyncio.gather(*dumps)
    found: dict[int, Reading | None] = {r.slot.local_rank: None for r in live}
    for rank, text in zip(ranks, texts, strict=True):
        lr = rank.slot.local_rank
        gen.stacks[lr] = text
        reading = read(text) or Reading(Where.STOPPED, (), "did not answer the stack dump")
        found[lr] = reading
        events.emit(
            StacksDumped(
                generation=gen.number,
                rank=rank.slot.rank,
                where=reading.where.name.lower(),
                lines=text.count("\n"),
                log=str(rank.files.stderr),
                stacks=text,  # quiet: the console shows them already, from the rank's log
            ),
        )
    for lr in stopped:
        if lr in found:
            found[lr] = Reading(Where.STOPPED, (), "stopped (SIGSTOP, or a debugger): left stopped")
    return found


@dataclass(frozen=True, slots=True)
class Seen:
    """A live rank as the monitor knew it when the deadline was missed."""

    rank: int
    last_seen: float
    iteration: int | None
    own: Hang | None  # its own deadline, if passed
    interval: Hang | None  # the interval it was in


def seen_now(gen: Generation, monitor: Monitor, now: float) -> dict[int, Seen]:
    """By local rank, the live ranks' last signs of life; a rank never heard from has
    been silent since the generation began."""
    out = {}
    for lr, r in gen.ranks.items():
        if r.returncode is not None:
            continue
        rank = r.slot.rank
        watch = monitor.watches.get(rank)
        if watch is None or watch.last_seen is None:
            out[lr] = Seen(rank, gen.started_at, None, None, None)
        else:
            t = monitor.timeouts
            own, interval = watch.expired(t, now, monitor.stalls), watch.current(t, now, monitor.stalls)
            out[lr] = Seen(rank, watch.last_seen, watch.iteration, own, interval)
    return out


def suspects(
    seen: dict[int, Seen], readings: dict[int, Reading | None], enqueued: Mapping[int, Mapping[str, int]]
) -> list[Suspect]:
    """The live ranks as the blame sees them: stacks, last message, iteration, own
    deadline, and the collectives their Flight Recorder says they enqueued (by local rank)."""
    return [Suspect(s.rank, readings.get(lr), s.last_seen, s.iteration, s.own, enqueued.get(lr))
            for lr, s in seen.items()]  # fmt: skip


async def failures(
    gen: Generation, monitor: Monitor
) -> tuple[tuple[RankFailure, ...], tuple[RankFailure, ...]]:
    """Every rank that failed on its own or hung, the root cause first; and the ranks
    we stopped that did not end cleanly (``Evidence.stopped``).

    The first includes ranks we stopped: one may have raised (and written its error
    file) first, then been slow to exit while a peer failed because of it. Its
    error file, written before we signalled it, gives it away.
    """
    found_all: list[RankFailure] = []
    stopped: list[RankFailure] = []
    for lr, exit in gen.exits.items():
        state = gen.ranks[lr].state
        if state not in (RankState.FAILED, RankState.STOPPED):
            continue
        files = gen.ranks[lr].files
        found = await failure_evidence(exit, files, gen.exit_offsets.get(lr, {}).get(files.stderr))
        hang, hang_at = gen.hangs.get(lr, (None, None))
        # its client's exception report, or any report the daemon noticed while it ran
        # (an error file, torch saying in its log that it takes the process down)
        said = [t for t in (monitor.exception_at.get(exit.rank), gen.reported.get(lr)) if t is not None]
        first = bool(said) and (gen.stop_mono is None or min(said) < gen.stop_mono)
        part = part_of(state, exit_code=exit.status.code, error_at=found.error_at, stop_wall=gen.stop_wall,
                       hung=hang is not None, reported_first=first)  # fmt: skip
        if part is None or part is Part.BYSTANDER:
            continue
        rank = exit.rank
        (found_all if part is Part.FAILED else stopped).append(
            replace(
                found,
                hang=hang,
                hang_at=hang_at,
                stacks=gen.stacks.get(lr, ""),
                exception=monitor.exceptions.get(rank),
                notable=gen.notable.get(rank, ()),
                after_exit=(*gen.after_exit.get(rank, ()), *found.after_exit),
                progressed=monitor.progressed(rank),
            )
        )
    return tuple(order_failures(found_all)), tuple(order_failures(stopped))
