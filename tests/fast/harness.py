"""Run the real daemon in-process, on virtual time, beside fake ranks.

``supervise(tmp_path, script, *options)`` builds the run's configuration from a
command line (the real parser), starts ``Supervisor`` on a ``VirtualTimeLoop``
with a ``LoopClock`` and fake ranks, and returns its exit code, the events it
wrote (read back from its event log) and the fake ranks. An optional operator
coroutine acts beside it (a stop, a restart request), waiting on events.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.cli import build_parser
from supervisor.config.build import build_run_config
from supervisor.coord.job import LocalJob, RendezvousJob
from supervisor.core.standby_start import CpuRoom
from supervisor.log import Console
from supervisor.runtime.lifecycle.daemon import Supervisor
from supervisor.runtime.records.rundir import RunDir
from tests.fast.fakes import Behaviour, FakeRanks, Script, events
from tests.fast.vloop import LoopClock, VirtualTimeLoop

DEADLINE = 4 * 3600.0  # virtual seconds: a scenario that runs longer is stuck


class Watcher:
    """Events as the daemon emits them, to wait on from an operator's coroutine."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self._news = asyncio.Event()

    def __call__(self, name: str, record: dict[str, Any]) -> None:
        self.seen.append((name, record))
        self._news.set()

    async def first(self, name: str, **match: Any) -> dict[str, Any]:
        return await self.nth(name, 1, **match)

    async def nth(self, name: str, n: int, **match: Any) -> dict[str, Any]:
        """The ``n``-th ``name`` event with ``match``-ing fields, once it has come."""
        while True:
            hits = [r for seen, r in self.seen if seen == name and match.items() <= r.items()]
            if len(hits) >= n:
                return hits[n - 1]
            self._news.clear()
            await self._news.wait()


Operator = Callable[[Supervisor, Watcher], Awaitable[None]]


@dataclass
class Run:
    code: int
    events: list[dict[str, Any]]
    ranks: FakeRanks
    rundir: Path
    daemon: Supervisor = field(repr=False)

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    def one(self, name: str) -> dict[str, Any]:
        found = self.named(name)
        assert len(found) == 1, (name, found, self.story())
        return found[0]

    def decisions(self) -> list[tuple[str, str]]:
        return [(e["action"], e["reason"]) for e in self.named("decision")]

    def story(self) -> str:
        return "\n".join(f"{e['event']} {({k: v for k, v in e.items() if k not in ('t_wall', 'run_id')})}"
                         for e in self.events)  # fmt: skip


def supervise(
    tmp_path: Path,
    script: Script,
    *options: str,
    behaviour: Callable[[int, int], Behaviour] | None = None,
    operator: Operator | None = None,
    job: Callable[[], LocalJob | RendezvousJob] | None = None,
    environ: dict[str, str] | None = None,
    room: CpuRoom | None = None,
) -> Run:
    loop = VirtualTimeLoop()
    scenario = _main(tmp_path, script, options, behaviour=behaviour, operator=operator, job=job,
                     environ=environ, room=room)  # fmt: skip
    try:
        return loop.run_until_complete(asyncio.wait_for(scenario, DEADLINE))
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
        gc.collect()  # what a scenario left open is reported against it, not a later test


async def _main(
    tmp_path: Path, script: Script, options: tuple[str, ...], *,
    behaviour: Callable[[int, int], Behaviour] | None, operator: Operator | None,
    job: Callable[[], LocalJob | RendezvousJob] | None, environ: dict[str, str] | None,
    room: CpuRoom | None = None,
) -> Run:  # fmt: skip
    argv = ["run", "--nproc-per-node", "2", "--no-cgroups", "--no-python", "--ft-bundle-timeout", "0",
            "--log-dir", str(tmp_path / "logs"), "--state-dir", str(tmp_path / "state"), *options,
            "fake-rank"]  # fmt: skip
    ns = build_parser().parse_args(argv)
    cfg = build_run_config(ns, environ or {})
    clock = LoopClock(asyncio.get_running_loop())  # type: ignore[arg-type]
    rundir = RunDir.create(cfg.log_dir, cfg.run_id, 1, clock.wall())
    logger = logging.getLogger("ft-supervisor.fast")
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    ranks = FakeRanks(script, clock, behaviour or (lambda generation, rank: Behaviour()))
    if room is not None:
        ranks.room = room
    daemon = Supervisor(cfg, rundir, logger, Console(), clock=clock, processes=ranks.processes(),
                        job=None if job is None else job())  # fmt: skip
    ranks.deliver = daemon.monitor.inbox.receive
    watcher = Watcher()
    daemon.events.listeners.append(watcher)
    acting = asyncio.ensure_future(operator(daemon, watcher)) if operator is not None else None
    try:
        code = await daemon.run()
    finally:
        if acting is not None:
            acting.cancel()
        await ranks.close()
    return Run(code, events(rundir.events), ranks, rundir.root, daemon)
