"""The control endpoint: requests from ``ft-supervisor status|stop|restart``.

A ROUTER socket: every request gets one reply, a malformed one an error reply;
nothing a client sends can take the daemon down.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import zmq.asyncio

from supervisor.runtime.events import EventLog
from supervisor.transport import schema
from supervisor.transport.schema import Dropped, DropReason

Handler = Callable[[str], Any]


class ControlServer:
    def __init__(self, sock: zmq.asyncio.Socket, handle: Handler, events: EventLog) -> None:
        self._sock = sock
        self._handle = handle
        self._events = events
        self.drops: Counter[DropReason] = Counter()

    async def run(self) -> None:
        while True:
            frames = await self._sock.recv_multipart()
            # ROUTER prepends the peer's identity; a REQ peer adds an empty delimiter
            *envelope, payload = frames
            await self._sock.send_multipart([*envelope, self._answer(payload)])

    def _answer(self, payload: bytes) -> bytes:
        try:
            request = schema.decode_control(payload)
        except Dropped as dropped:
            self.drops[dropped.reason] += 1
            if self.drops[dropped.reason] == 1:
                self._events.emit(
                    "control_dropped", logging.WARNING, reason=str(dropped.reason), detail=dropped.detail
                )
            return schema.reply(None, ok=False, error=str(dropped))
        try:
            data = self._handle(request.command)
        except Exception as exc:
            self._events.emit("control_failed", logging.ERROR, command=request.command, error=repr(exc))
            return schema.reply(request.id, ok=False, error=f"{request.command} failed: {exc}")
        return schema.reply(request.id, ok=True, data=data)
