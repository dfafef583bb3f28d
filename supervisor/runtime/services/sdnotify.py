"""systemd's notify protocol (sd_notify(3)) with the standard library.

One AF_UNIX datagram per notification to ``$NOTIFY_SOCKET`` (a path, or
``@name`` for an abstract socket). Sending never blocks (a full queue drops the
datagram) and never raises into the daemon; without ``$NOTIFY_SOCKET`` every
call is a no-op. The variables are taken out of the environment, as
sd_notify's ``unset_environment`` does, so that no rank inherits them: a rank
that notified systemd itself would be taken for the daemon.

``SdNotify`` listens to the event log (every event, on the loop) and sends what
``supervisor.core.notify.Narrator`` says follows from it; ``watchdog()`` pings
from a task on the same loop, so a wedged loop stops the pings and systemd
restarts the service: that is what the watchdog is for.
"""

from __future__ import annotations

import socket
from collections.abc import MutableMapping
from typing import Any

from supervisor.clock import SYSTEM
from supervisor.core.catalogue.services import NotifyFailed
from supervisor.core.notify import Narrator, notify_address, watchdog_interval
from supervisor.runtime.records.events import EventLog

ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    """Sends assignments to the service manager; counts what it could not send."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        self.sent = 0
        self.failed = 0
        self.error: str | None = None  # the last failure
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *assignments: str) -> bool:
        """One datagram of ``KEY=value`` lines; False when it was not delivered."""
        if self.address is None or not assignments:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(assignments).encode(), self.address)
        except OSError as exc:  # gone, refused, queue full: the daemon's work comes first
            self.failed += 1
            self.error = f"{type(exc).__name__}: {exc.strerror or exc}"
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class SdNotify:
    """The daemon's lifecycle, told to systemd: READY, STATUS, STOPPING, RELOADING, WATCHDOG."""

    def __init__(self, notifier: Notifier, watchdog: float | None, events: EventLog) -> None:
        self.notifier = notifier
        self.watchdog_interval = watchdog if notifier.enabled else None
        self._events = events
        self._narrator = Narrator()

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str], pid: int, events: EventLog) -> SdNotify:
        """Read (and unset) the notify variables of ``environ``."""
        notifier = Notifier(notify_address(environ.get("NOTIFY_SOCKET")))
        watchdog = watchdog_interval(environ, pid)
        for name in ENV:
            environ.pop(name, None)
        return cls(notifier, watchdog, events)

    @property
    def ready(self) -> bool:
        return self._narrator.ready

    def hear(self, event: str, record: dict[str, Any]) -> None:
        """An event-log listener: never raises (a raising listener would be dropped)."""
        if not self.notifier.enabled:
            return
        failed = self.notifier.failed
        try:
            assignments = self._narrator.hear(event, record)
        except (TypeError, ValueError, KeyError):
            return  # a record shaped differently than expected: no notification, no crash
        if assignments and not self.notifier.send(*assignments) and failed == 0:
            # once: a missing socket fails every send alike (this event sends nothing)
            address = (self.notifier.address or "").replace("\0", "@", 1)
            self._events.emit(NotifyFailed(address=address, error=self.notifier.error))

    def close(self) -> None:
        self.notifier.close()

    async def watchdog(self) -> None:
        """Ping every half watchdog period until cancelled; return at once without one."""
        interval = self.watchdog_interval
        if interval is None:
            return
        while True:
            self.notifier.send("WATCHDOG=1")
            await SYSTEM.sleep(interval)
