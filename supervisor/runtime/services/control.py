"""The control endpoint: requests from ``ft-supervisor status|stop|restart``.

A ROUTER socket: every request gets one reply, a malformed one an error reply;
nothing a client sends can take the daemon down, and no stream of requests can
take the loop away from supervision:

* each wake-up answers at most ``BATCH`` requests, then lets the loop run the rest
  of its work (a rank's exit, a deadline) before it comes back for more;
* requests beyond ``RATE`` a second (a burst of ``BURST``) are answered "busy" at
  the cost of a refusal, and counted (``control_busy`` in ``status``'s drops);
* a ``status`` asked again within ``STATUS_TTL`` gets the same reply: building it
  walks every rank, and a tight loop of clients must not make it the daemon's job.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from supervisor.clock import Clock
from supervisor.core.catalogue.services import ControlDropped, ControlFailed
from supervisor.runtime.records.events import EventLog
from supervisor.transport import schema
from supervisor.transport.schema import Dropped

Handler = Callable[[str], Any]

BATCH = 64  # requests answered per wake-up of the loop
RATE = 200.0  # requests a second, sustained...
BURST = 100  # ...and at once
STATUS_TTL = 0.1  # seconds a status reply is reused
BUSY = "busy"


class ControlServer:
    def __init__(self, sock: zmq.asyncio.Socket, handle: Handler, events: EventLog, clock: Clock) -> None:
        self._sock = sock
        # the same socket, without asyncio: draining what is queued needs no wake-up
        self._sync: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        self._handle = handle
        self._events = events
        self._clock = clock
        self.drops: Counter[str] = Counter()
        self._tokens = float(BURST)
        self._refilled = clock.monotonic()
        self._status: tuple[float, Any] | None = None  # when built, and its data

    async def run(self) -> None:
        """Answer requests until cancelled (an edge-triggered reader, as the monitor's)."""
        loop = asyncio.get_running_loop()
        fd = int(self._sync.getsockopt(zmq.FD))
        loop.add_reader(fd, self._drain)
        try:
            self._drain()
            await loop.create_future()
        finally:
            loop.remove_reader(fd)

    def _drain(self) -> None:
        sock = self._sync
        for _ in range(BATCH):
            if not int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            # ROUTER prepends the peer's identity; a REQ peer adds an empty delimiter
            *envelope, payload = frames
            try:
                sock.send_multipart([*envelope, self._answer(payload)], zmq.NOBLOCK)
            except zmq.ZMQError:
                self._count("unanswered")  # a client that does not read its replies
        # more queued: no new edge will come for it, so come back after the loop's other work
        asyncio.get_running_loop().call_soon(self._drain)

    def _admit(self) -> bool:
        now = self._clock.monotonic()
        self._tokens = min(float(BURST), self._tokens + (now - self._refilled) * RATE)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _count(self, reason: str, detail: str = "") -> None:
        self.drops[reason] += 1
        if self.drops[reason] == 1:  # once per reason; the rest are counted
            self._events.emit(ControlDropped(reason=reason, detail=detail or None))

    def _answer(self, payload: bytes) -> bytes:
        try:
            request = schema.decode_control(payload)
        except Dropped as dropped:
            self._count(str(dropped.reason), dropped.detail)
            return schema.reply(None, ok=False, error=str(dropped))
        if not self._admit():
            self._count(BUSY, f"more than {RATE:g} requests a second")
            return schema.reply(request.id, ok=False, error=f"{BUSY}: more than {RATE:g} requests a second")
        try:
            data = self._status_now() if request.command == "status" else self._handle(request.command)
        except Exception as exc:
            self._events.emit(ControlFailed(command=request.command, error=repr(exc)))
            return schema.reply(request.id, ok=False, error=f"{request.command} failed: {exc}")
        return schema.reply(request.id, ok=True, data=data)

    def _status_now(self) -> Any:
        now = self._clock.monotonic()
        if self._status is None or now - self._status[0] >= STATUS_TTL:
            self._status = (now, self._handle("status"))
        return self._status[1]
