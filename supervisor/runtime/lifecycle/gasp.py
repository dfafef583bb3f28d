"""The dying gasp: before ranks are stopped, those that can save are asked to.

A rank that registered a save callback (``supervisor.client.on_save``) keeps a
second socket, served by a thread of its own, so the request reaches it even
while its training loop is blocked in a collective with a dead peer. Before
the termination procedure runs (a failure, a hang, a peer's news, an operator
restart, a stop signal from the scheduler) every live rank with a callback,
but a hung one, gets "save now" and the deadline; the daemon waits until each
one answered, exited, or the deadline passed, then stops the ranks as usual. MindCluster calls this
strategy ``dump``; here it costs nothing to ranks without a callback.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from supervisor.clock import Clock
from supervisor.core.catalogue.checkpoints import SaveFinished, SaveRequested
from supervisor.process.spawn import RankProcess
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.records.events import EventLog


async def ask_to_save(
    gen: Generation,
    monitor: Monitor,
    *,
    deadline: float,
    why: str,
    events: EventLog,
    clock: Clock,
    force: asyncio.Event,
) -> None:
    """Ask the generation's live ranks to save, and wait for them (``deadline`` s at most)."""
    if deadline <= 0 or force.is_set():
        return
    asked: dict[str, RankProcess] = {}
    # from before the first ask: a rank may start saving while the next is asked, and
    # the deadline and the figure are how long the saves held the stop
    started = clock.monotonic()
    for local_rank, rank in gen.ranks.items():
        # a hung rank is not asked: its state is in doubt, and a rank stuck holding the
        # GIL could not answer, so it would only hold the restart for the whole deadline
        if rank.returncode is not None or local_rank in gen.hangs:
            continue
        request_id = secrets.token_hex(8)
        if monitor.ask_to_save(rank.slot.rank, request_id, why, deadline):
            asked[request_id] = rank
    if not asked:
        return
    events.emit(SaveRequested(generation=gen.number, ranks=sorted(r.slot.rank for r in asked.values()),
                              deadline=deadline, why=why))  # fmt: skip
    await _answers(asked, monitor, started + deadline, clock, force)
    answers = {rid: monitor.saves.get(rid) for rid in asked}
    saved = sorted(asked[rid].slot.rank for rid, a in answers.items() if a is not None and a.ok)
    failed = {str(asked[rid].slot.rank): a.error for rid, a in answers.items() if a is not None and not a.ok}
    silent = sorted(asked[rid].slot.rank for rid, a in answers.items() if a is None)
    events.emit(
        SaveFinished(
            generation=gen.number,
            saved=saved,
            failed=failed or None,
            # no answer: the deadline passed, the rank exited first, or a second Ctrl-C forced the stop
            unanswered=silent or None,
            seconds=round(clock.monotonic() - started, 3),
        ),
        logging.INFO if not failed and not silent else logging.WARNING,
    )


async def _answers(
    asked: dict[str, RankProcess], monitor: Monitor, until: float, clock: Clock, force: asyncio.Event
) -> None:
    while not force.is_set():
        pending = [r for rid, r in asked.items() if rid not in monitor.saves and r.returncode is None]
        left = until - clock.monotonic()
        if not pending or left <= 0:
            return
        monitor.save_news.clear()
        waits = [
            asyncio.ensure_future(monitor.save_news.wait()),
            asyncio.ensure_future(force.wait()),
            *(asyncio.ensure_future(r.proc.wait()) for r in pending),
        ]
        try:
            await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
