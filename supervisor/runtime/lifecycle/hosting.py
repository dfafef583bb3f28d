"""The daemon as a service: what systemd or a container runtime needs of it.

* sd_notify: READY once the first generation's ranks are up, STATUS lines,
  STOPPING, RELOADING around a reload, WATCHDOG pings (``sdnotify``);
* SIGHUP reloads the config file when there is one (``reload``);
* orphans: the daemon is their subreaper (or PID 1) and reaps them (``reaper``);
* signals a container runtime sends PID 1 for the application (SIGUSR2,
  SIGWINCH) are passed on to the running ranks' process groups.

Exit codes are the contract's (docs/reference/exit-codes.md), the same as outside a container.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

from supervisor.clock import SYSTEM
from supervisor.config.run import RunConfig
from supervisor.core.catalogue.daemon import Hosting as HostingEvent
from supervisor.core.catalogue.daemon import OrphanReaped, SignalForwarded
from supervisor.core.states import RankState
from supervisor.core.types import signal_name
from supervisor.process.reaper import Reaper, become_subreaper
from supervisor.process.terminate import Signaller
from supervisor.runtime.lifecycle import signals
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.lifecycle.reload import Reloader
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.services.sdnotify import SdNotify

REAP_INTERVAL = 1.0


class Hosting:
    def __init__(
        self,
        cfg: RunConfig,
        events: EventLog,
        monitor: Monitor,
        logger: logging.Logger,
        signaller: Signaller,
        *,
        adopt_orphans: bool = True,
    ) -> None:
        """Call before any process is started: orphans must find the subreaper in place,
        and nothing must inherit the notify socket. Without ``adopt_orphans`` (fake
        ranks, in-process) the daemon neither adopts nor reaps anything."""
        self.pid1 = os.getpid() == 1
        self._adopts = adopt_orphans
        self.subreaper = adopt_orphans and not self.pid1 and become_subreaper()
        self.notify = SdNotify.from_environ(os.environ, os.getpid(), events)
        self._cfg = cfg
        self._events = events
        self._signaller = signaller
        self._reloader = Reloader(cfg, monitor, logger, events)
        self._reloading: asyncio.Task[None] | None = None
        self._reload_again = False
        self._spawned: set[int] = set()  # live ranks: the loop reaps those, never us
        self._sentinel: int | None = None
        events.listeners.append(self._hear)

    def _hear(self, event: str, record: dict[str, Any]) -> None:
        if event == "rank_spawned":
            self._spawned.add(record.get("pid", -1))
        elif event == "rank_exited":
            self._spawned.discard(record.get("pid", -1))
        self.notify.hear(event, record)
        if event == "run_finished":  # the daemon's last word
            self.notify.close()

    def _ours(self, pid: int) -> bool:
        return pid in self._spawned or pid == self._sentinel

    async def run(self, sentinel: int) -> None:
        """Watchdog pings and orphan reaping, until cancelled."""
        self._sentinel = sentinel
        hosting = self._cfg.hosting
        self._events.emit(
            HostingEvent(
                pid1=self.pid1,
                subreaper=self.subreaper,
                notify=self.notify.notifier.enabled,
                watchdog_interval=self.notify.watchdog_interval,
                reload_file=None if hosting.config_file is None else str(hosting.config_file),
                forward_signals=[signal_name(s) for s in hosting.forward_signals] or None,
            ),
        )
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.notify.watchdog())
            if self._adopts:
                tg.create_task(self._reap())

    async def _reap(self) -> None:
        reaper = Reaper(self._ours)
        while True:
            for pid, status in reaper.reap():
                self._events.emit(
                    OrphanReaped(pid=pid, status=status, signal=signal_name(-status) if status < 0 else None),
                )
            await SYSTEM.sleep(REAP_INTERVAL)

    def _reload(self) -> None:
        """One reload at a time, in a task of its own (a stop never waits behind a parse);
        a SIGHUP that comes meanwhile is served once the current one is done."""
        if self._reloading is not None and not self._reloading.done():
            self._reload_again = True
            return

        async def serve() -> None:
            await self._reloader.reload()
            while self._reload_again:
                self._reload_again = False
                await self._reloader.reload()

        self._reloading = asyncio.get_running_loop().create_task(serve(), name="reload")

    def handle(self, command: signals.Reload | signals.Forward, gen: Generation | None) -> None:
        if isinstance(command, signals.Reload):
            self._reload()
            return
        running = [] if gen is None else [r for r in gen.ranks.values() if r.state is RankState.RUNNING]
        for rank in running:
            self._signaller.group(rank.pid, command.signum)
        self._events.emit(
            SignalForwarded(
                signal=signal_name(command.signum),
                generation=None if gen is None else gen.number,
                ranks=[r.slot.rank for r in running],
            ),
            # a terminal resize sends SIGWINCH often: routine
            logging.DEBUG if command.signum == signal.SIGWINCH else logging.INFO,
        )
