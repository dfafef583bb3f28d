"""Whether this run's ranks are forked from a fork server, and the server's life.

The server (``supervisor.process.forkserver``) starts with the first generation,
is ready once it has imported the preload, and lives as long as the daemon; a rank
it cannot give (the server died, or did not answer) is spawned afresh, and so is
every rank after that. Where forking cannot keep a promise the daemon makes, ranks
are spawned and the ``fork_server`` event says why:

* no preload (``--preload none``, ``--no-python``): there is nothing to share;
* no subreaper: a forked rank would be adopted by init, out of the daemon's reach;
* no cgroup per generation: the token sweep finds a rank's descendants by the
  environment they were started with, which for a fork is the server's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from supervisor.clock import Clock
from supervisor.config.run import RunConfig
from supervisor.core.catalogue.generation import ForkServer as ForkServerEvent
from supervisor.core.catalogue.generation import ForkServerLost
from supervisor.core.topology import ENV_TOKEN, RankSlot, Topology
from supervisor.process.cgroups import Containment
from supervisor.process.forkserver import ForkServer
from supervisor.process.spawn import RankFiles, RankProcess
from supervisor.runtime.records.events import EventLog

EnvFor = Callable[[RankSlot], Mapping[str, str]]


def why_not(cfg: RunConfig, adopts: bool) -> str | None:
    """Why this run's ranks cannot be forked, or None."""
    program = cfg.program
    if not cfg.fork_server:
        return "--no-fork-server was given"
    if program.kind == "exec":
        return "the program is not run by Python (--no-python)"
    if not program.preload:
        return "nothing is preloaded (--preload none)"
    if not adopts:
        return "the daemon cannot adopt its ranks' orphans (no subreaper)"
    return None


def shared_env(topology: Topology, env_for: EnvFor, run_token: str) -> dict[str, str]:
    """What every local rank's environment has in common: the server's, under which
    the preload initialises. Its token says it belongs to the run but to no generation,
    so the run's last sweep finds it and no generation's does."""
    envs = [env_for(slot) for slot in topology.slots()]
    common = {k: v for k, v in envs[0].items() if all(e.get(k) == v for e in envs[1:])}
    common[ENV_TOKEN] = f"{run_token}/fork-server"
    return common


class ForkServing:
    def __init__(self, cfg: RunConfig, events: EventLog, clock: Clock, *, adopts: bool, log: Path) -> None:
        self._cfg = cfg
        self._events = events
        self._clock = clock
        self._log = log
        self._why_not = why_not(cfg, adopts)
        self._told = False
        self._server: ForkServer | None = None
        self._ready_after: float | None = None
        self._starting = asyncio.Lock()

    def _off(self, why: str, level: int = logging.DEBUG) -> None:
        self._why_not = why
        if not self._told:
            self._told = True
            self._events.emit(ForkServerEvent(mode="off", why=why), level)

    async def fork(
        self,
        topology: Topology,
        slot: RankSlot,
        env: Mapping[str, str],
        files: RankFiles,
        *,
        env_for: EnvFor,
        run_token: str,
        standby: bool,
        containment: Containment,
    ) -> RankProcess | None:
        """A rank forked from the server; None: spawn it."""
        if self._why_not is None and containment.cgroup is None:
            self._why_not = f"no cgroup per generation ({containment.why or 'fallback'})"
        if self._why_not is not None:
            self._off(self._why_not)
            return None
        server = await self._server_for(topology, env_for, run_token)
        if server is None:
            return None
        try:
            return await server.fork(slot, env, files, now=self._clock.monotonic(), standby=standby,
                                     containment=containment)  # fmt: skip
        except OSError as exc:
            self._events.emit(ForkServerLost(pid=server.pid,
                                             returncode=server.proc.returncode, error=str(exc)))  # fmt: skip
            self._why_not = self._why_not or "the fork server was lost"
            self._told = True
            return None

    async def _server_for(self, topology: Topology, env_for: EnvFor, run_token: str) -> ForkServer | None:
        async with self._starting:
            if self._server is not None or self._why_not is not None:
                return self._server if self._why_not is None else None
            since = self._clock.monotonic()
            try:
                server = await ForkServer.start(self._cfg.program, shared_env(topology, env_for, run_token),
                                                self._log)  # fmt: skip
            except OSError as exc:
                self._off(f"cannot start the fork server: {exc.strerror or exc}", logging.WARNING)
                return None
            try:
                why = await server.ready()
            except asyncio.CancelledError:  # a stop while it preloads
                server.kill()
                raise
            if why is not None:
                await server.close(self._cfg.kill_timeout)
                self._off(f"no fork server: {why} (see {self._log})", logging.WARNING)
                return None
            self._server = server
            self._told = True
            self._ready_after = round(self._clock.monotonic() - since, 3)
            self._events.emit(
                ForkServerEvent(
                    mode="on",
                    pid=server.pid,
                    modules=list(self._cfg.program.preload),
                    seconds=self._ready_after,
                )
            )
            return server

    def describe(self) -> dict[str, Any] | None:
        """None until the first generation decided it."""
        if self._server is not None and self._why_not is None:
            return {"mode": "on", "pid": self._server.pid, "modules": list(self._cfg.program.preload),
                    "seconds": self._ready_after}  # fmt: skip
        if self._told and self._why_not is not None:
            return {"mode": "off", "why": self._why_not}
        return None

    async def close(self, timeout: float) -> None:
        async with self._starting:
            server, self._server = self._server, None
            self._why_not = self._why_not or "the run is over"
        if server is not None:
            await server.close(timeout)
