"""A counting TCP proxy in front of a torch TCPStore (for scale.py).

torch's TCPStore keeps no request counter, so the simulated nodes reach the
store through this proxy. The store's protocol is strictly request/response on
each connection (a ``wait`` is one request whose answer comes late), so a
request is a burst of bytes from a client after the store last spoke (or after
connecting); its first byte is torch's ``QueryType``. The proxy forwards bytes
untouched and counts requests, their types and the bytes each way.

Usage: ``python _store_proxy.py STORE_PORT``: prints the port it listens on;
each line read on stdin is answered with one JSON line of the counts so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, cast

import orjson

# torch/csrc/distributed/c10d/TCPStore.cpp, enum class QueryType (torch 2.13)
QUERY_TYPES = (
    "validate", "set", "compare_set", "get", "add", "check", "wait", "getnumkeys",
    "delete_key", "append", "multi_get", "multi_set", "cancel_wait", "ping",
    "queue_push", "queue_pop", "queue_len",
)  # fmt: skip

requests: Counter[str] = Counter()
traffic = {"up": 0, "down": 0, "connections": 0}


class _Side(asyncio.Protocol):
    def __init__(self) -> None:
        self.peer: _Side | None = None
        self.transport: asyncio.Transport | None = None
        self.pending: list[bytes] = []
        self.client = False
        self.turn = True  # for a client side: its next bytes begin a request

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no asyncio.Transport subclass
        for chunk in self.pending:  # what the client sent before this side was connected, in order
            self.transport.write(chunk)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if self.client:
            traffic["up"] += len(data)
            if self.turn:
                kind = data[0]
                requests[QUERY_TYPES[kind] if kind < len(QUERY_TYPES) else f"type{kind}"] += 1
                self.turn = False
        else:
            traffic["down"] += len(data)
            if peer is not None:
                peer.turn = True
        if peer is None or peer.transport is None:
            if peer is not None:
                peer.pending.append(data)
            return
        peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


class _Client(_Side):
    def __init__(self, store_port: int) -> None:
        super().__init__()
        self.client = True
        self.store_port = store_port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        traffic["connections"] += 1
        upstream = _Side()
        upstream.peer, self.peer = self, upstream
        asyncio.get_running_loop().create_task(self._connect(upstream))

    async def _connect(self, upstream: _Side) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.create_connection(lambda: upstream, "127.0.0.1", self.store_port)
        except OSError:
            if self.transport is not None:
                self.transport.close()


async def main(store_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(store_port), "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.readline():
        sys.stdout.write(orjson.dumps({"requests": dict(requests), **traffic}).decode() + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    runner: Callable[[Coroutine[Any, Any, None]], None]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(main(int(sys.argv[1])))
