"""After a generation ends: its ranks' stacks (if one hung) and the evidence."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from supervisor.core.errorfile import order_failures
from supervisor.core.states import RankState
from supervisor.core.types import RankFailure
from supervisor.process.evidence import failure_evidence
from supervisor.process.stacks import dump_stacks
from supervisor.runtime.events import EventLog
from supervisor.runtime.generation import Generation
from supervisor.runtime.monitor import Monitor


async def collect_stacks(gen: Generation, monitor: Monitor, timeout: float, events: EventLog) -> None:
    """Every live rank's stacks into its log, before the kill: all at once, since
    this is on the critical path of the restart."""
    ranks = [
        r
        for r in gen.ranks.values()
        if r.returncode is None and monitor.stack_signals.get(r.slot.rank) is not None
    ]
    texts = await asyncio.gather(
        *(dump_stacks(r.pid, monitor.stack_signals[r.slot.rank], r.files.stderr, timeout) for r in ranks)
    )
    for rank, text in zip(ranks, texts, strict=True):
        gen.stacks[rank.slot.local_rank] = text
        events.emit(
            "stacks_dumped",
            generation=gen.number,
            rank=rank.slot.rank,
            hung=rank.slot.local_rank in gen.hangs,
            lines=text.count("\n"),
            log=str(rank.files.stderr),
            stacks=text,
            quiet=("stacks",),  # the console shows them already, from the rank's log
        )


async def failures(gen: Generation, monitor: Monitor) -> tuple[RankFailure, ...]:
    """Every rank that failed on its own or hung, the root cause first.

    That includes ranks we stopped: one may have raised (and written its error
    file) first, then been slow to exit while a peer failed because of it. Its
    error file, written before we signalled it, gives it away.
    """
    found_all = []
    for lr, exit in gen.exits.items():
        state = gen.ranks[lr].state
        if state not in (RankState.FAILED, RankState.STOPPED):
            continue
        found = await failure_evidence(exit, gen.ranks[lr].files)
        hang, hang_at = gen.hangs.get(lr, (None, None))
        failed_first = found.error_at is not None and (
            gen.stop_wall is None or found.error_at < gen.stop_wall
        )
        if state is RankState.FAILED or failed_first or hang is not None:
            rank = exit.rank
            found_all.append(
                replace(
                    found,
                    hang=hang,
                    hang_at=hang_at,
                    stacks=gen.stacks.get(lr, ""),
                    exception=monitor.exceptions.get(rank),
                    notable=gen.notable.get(rank, ()),
                    progressed=monitor.progressed(rank),
                )
            )
    return tuple(order_failures(found_all))
