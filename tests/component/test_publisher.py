"""The events socket's publisher over a real XPUB socket: a subscription that comes in
while the daemon is publishing is never lost."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from supervisor.runtime.services.publisher import Publisher


@pytest.mark.asyncio
async def test_a_subscription_that_arrives_while_the_daemon_publishes_is_applied(tmp_path: Path) -> None:
    # ZeroMQ's FD is edge-triggered, and a send processes the socket's pending commands:
    # a publish made while a subscription waited took the edge that should have woken the
    # reader, and the subscriber then heard nothing, ever (a CI run hung on it)
    endpoint = f"ipc://{tmp_path / 'events.sock'}"
    actx = zmq.asyncio.Context()
    sctx = zmq.Context()
    try:
        xpub = actx.socket(zmq.XPUB)
        xpub.setsockopt(zmq.LINGER, 0)
        xpub.bind(endpoint)
        publisher = Publisher(xpub)
        reading = asyncio.ensure_future(publisher.run())
        await asyncio.sleep(0)  # the reader is in place
        sub = sctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)
        # the loop is busy (no reader runs) while the subscription arrives, then publishes
        deadline = time.monotonic() + 10
        while not int(publisher._sync.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            assert time.monotonic() < deadline, "the subscription never reached the socket"
            time.sleep(0.01)
        publisher.publish(b"status", b"{}")

        async def heard() -> bytes:
            while True:
                publisher.publish(b"status", b"{}")
                if sub.poll(0):
                    return bytes(sub.recv_multipart()[0])
                await asyncio.sleep(0.02)

        assert await asyncio.wait_for(heard(), 10) == b"status"
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
    finally:
        sctx.destroy(linger=0)
        actx.destroy(linger=0)
