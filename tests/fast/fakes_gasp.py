"""A fake rank's saver socket (the dying gasp), for the runtime's fast tier.

A real rank that registers a save callback (``supervisor.client.on_save``) opens a
second socket, served by a thread of its own: its ``saver`` message comes from that
socket's identity, and the daemon's "save now" goes back to it with
``Inbox.send(identity, payload)`` on the ROUTER socket, which no fake can read. Here
the fake harness stands between: ``Savers.operator`` wraps the daemon's
``monitor.inbox.send`` so that a payload for a fake saver's identity is handed to that
rank's callback instead (anything else goes on to the real socket). The callback runs
as a task of its own, beside the rank's script (a script blocked in a "collective"
still answers), and its answer is the client's ``saved`` message, signed with the
rank's key, from the saver's identity.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from supervisor.core.topology import ENV_KEY
from supervisor.runtime.lifecycle.daemon import Supervisor
from supervisor.transport.schema import encode
from tests.fast.fakes import Rank
from tests.fast.harness import Operator, Watcher


@dataclass(frozen=True)
class SaveRequest:
    """What "save now" told the rank (the client's ``SaveRequest``)."""

    id: str
    reason: str
    deadline: float


SaveCallback = Callable[[Rank, SaveRequest], Awaitable[None]]


@dataclass
class Savers:
    """Every fake saver of a test, by identity, and the requests they were sent."""

    by_identity: dict[bytes, tuple[Rank, SaveCallback]] = field(default_factory=dict)
    requests: list[tuple[int, SaveRequest]] = field(default_factory=list)  # (rank, request)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def register(self, rank: Rank, callback: SaveCallback) -> None:
        """``client.on_save(callback)``: the saver's own identity says ``saver`` with the rank's pid."""
        identity = rank.identity + b"-saver"
        self.by_identity[identity] = (rank, callback)
        self._send(rank, identity, "saver", pid=rank.pid, id=secrets.token_hex(4))

    def operator(self, then: Operator | None = None) -> Operator:
        """The harness's operator: it puts the seam in place, then acts as ``then``."""

        async def act(daemon: Supervisor, seen: Watcher) -> None:
            inbox = daemon.monitor.inbox
            real_send = inbox.send

            def send(identity: bytes, payload: bytes) -> bool:
                if identity not in self.by_identity:
                    return real_send(identity, payload)
                self._deliver(identity, orjson.loads(payload))
                return True

            inbox.send = send  # type: ignore[method-assign]
            if then is not None:
                await then(daemon, seen)

        return act

    def _deliver(self, identity: bytes, message: dict[str, Any]) -> None:
        rank, callback = self.by_identity[identity]
        assert message["type"] == "save", message
        request = SaveRequest(message["id"], message["reason"], message["deadline"])
        self.requests.append((rank.rank, request))
        if rank.proc.returncode is None:
            self._tasks.append(asyncio.ensure_future(self._save(rank, identity, callback, request)))

    async def _save(self, rank: Rank, identity: bytes, callback: SaveCallback, request: SaveRequest) -> None:
        started = rank.ranks.clock.monotonic()
        ok, error = True, ""
        try:
            await callback(rank, request)
        except Exception as exc:  # what the client reports of a callback's failure
            ok, error = False, f"{type(exc).__name__}: {exc}"
        if rank.proc.returncode is None:  # the process is gone, and its saver thread with it
            seconds = round(rank.ranks.clock.monotonic() - started, 6)
            self._send(rank, identity, "saved", id=request.id, ok=ok, error=error, seconds=seconds)

    @staticmethod
    def _send(rank: Rank, identity: bytes, kind: str, **fields: Any) -> None:
        payload = encode(kind, rank=rank.rank, gen=rank.generation, k=rank.env[ENV_KEY], **fields)
        rank.ranks.deliver([identity, payload])
