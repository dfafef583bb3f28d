"""A rank still running ``--exit-grace`` after every other rank exited 0: look, then decide.

Its stacks are taken before it is ended (faulthandler's through its client, py-spy's
native ones: the hang bundle), one ``rank_exit_stuck`` event says where it stands,
and ``supervisor.core.lingering`` says whether the run succeeded (the rank had
finished its work and was stuck on its way out) or not, and why. The termination
procedure then ends it (SIGKILL: a deadlock at exit answers nothing else).
"""

from __future__ import annotations

import asyncio
from typing import Any

from supervisor.clock import Clock
from supervisor.core.catalogue.ranks import RankExitStuck
from supervisor.core.lingering import finished_work, verdict, where_stuck
from supervisor.core.types import Decision
from supervisor.process.terminate import Signaller
from supervisor.runtime.lifecycle import aftermath, bundle
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.records.events import EventLog


async def examine(
    gen: Generation, monitor: Monitor, *, grace: float, restarts_left: int, stack_timeout: float,
    bundle_timeout: float, clock: Clock, events: EventLog, signals: Signaller,
) -> None:  # fmt: skip
    """Stacks, the bundle and the verdict of every lingering rank of ``gen``: the
    ones done with their work are marked so (the generation then succeeds), the
    first decision otherwise ends the generation (``gen.decide_now``)."""
    if not gen.lingering:
        return
    noticed = min(gen.lingering.values())
    # when the last of the others exited 0: how long a lingering rank outlived them
    exits = [e.at for lr, e in gen.exits.items() if lr not in gen.lingering]
    if gen.other_nodes_done is not None:  # and every rank of the other nodes
        exits.append(gen.other_nodes_done)
    peers_gone = max(exits, default=noticed - grace)
    readings, got = await asyncio.gather(
        aftermath.collect_stacks(gen, monitor, stack_timeout, events, signals=signals, clock=clock),
        bundle.gather(gen, bundle_timeout),
    )
    others = [monitor.watches.get(r.slot.rank) for lr, r in gen.ranks.items() if lr not in gen.lingering]
    peers_last = max((w.iteration for w in others if w is not None and w.iteration is not None), default=None)
    found: list[dict[str, Any]] = []
    decisions: list[Decision] = []
    for lr in sorted(gen.lingering):
        r = gen.ranks[lr]
        rank = r.slot.rank
        watch = monitor.watches.get(rank)
        iteration = None if watch is None else watch.iteration
        native = got.native.get(lr)
        stuck = where_stuck(gen.stacks.get(lr), None if native is None else native.text)
        finished = finished_work(iteration, peers_last, watch is not None and watch.closed)
        waited = clock.monotonic() - peers_gone
        decision, why = verdict(rank, waited=waited, finished=finished, stuck=stuck, iteration=iteration,
                                peers_last=peers_last, restarts_left=restarts_left)  # fmt: skip
        entry: dict[str, Any] = {
            "rank": rank, "pid": r.pid, "waited": round(waited, 3), "where": list(stuck.where),
            "teardown": stuck.teardown, "finished": finished, "success": decision is None, "why": why,
            "iteration": iteration, "peers_iteration": peers_last,
        }  # fmt: skip
        found.append(entry)
        events.emit(RankExitStuck(generation=gen.number, after="peers_succeeded",
                                  native_error=None if native is None else native.error,
                                  **entry))  # fmt: skip
        if decision is None:
            gen.lingering_done.add(lr)
        else:
            decisions.append(decision)
    gen.bundle = await bundle.write_lingering(gen, monitor, lingering=found, readings=readings, got=got,
                                              noticed=noticed, clock=clock, events=events)  # fmt: skip
    if decisions:
        gen.lingering_done.clear()  # the generation did not succeed: one rank was not done
        gen.decide_now(decisions[0])
