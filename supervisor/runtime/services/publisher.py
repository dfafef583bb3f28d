"""The events socket: every event to live subscribers, with a bounded subscription table.

A plain PUB socket keeps whatever topics its subscribers send: 100,000 distinct
topics took a daemon to 3.45 GB and made every publish walk them. This one is an
XPUB in manual mode: the daemon reads each subscription and applies only what it
accepts: "" (every event), an event name the daemon has published or a prefix of
one (the vocabulary is small), and besides those at most ``MAX_TOPICS`` distinct
topics of up to ``MAX_TOPIC`` bytes over the daemon's life (a name not published
yet). The rest are refused and counted; whoever used up the allowance, a subscriber
to every event or to a known one still gets in. Sends never wait: a slow subscriber
loses events (the event log has them all).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import zmq
import zmq.asyncio

MAX_TOPIC = 64
MAX_TOPICS = 256
BATCH = 1000  # subscription messages read per wake-up


class Publisher:
    def __init__(self, sock: zmq.asyncio.Socket) -> None:
        sock.setsockopt(zmq.XPUB_MANUAL, 1)
        self._sync: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        self.topics: set[bytes] = set()  # accepted besides the known ones
        self.known: set[bytes] = {b""}  # every published name and each of its prefixes
        self._published: set[bytes] = set()
        self.refused: Counter[str] = Counter()
        self._draining = False  # a drain is scheduled
        self._running = False  # run() reads subscriptions (the socket is open)

    def publish(self, topic: bytes, line: bytes) -> None:
        if topic not in self._published:
            self._published.add(topic)
            self.known.update(topic[:n] for n in range(len(topic) + 1))
        with contextlib.suppress(zmq.ZMQError):  # full (a slow subscriber): dropped, never waited for
            self._sync.send_multipart([topic, line], zmq.NOBLOCK)
        self._after_send()

    def _after_send(self) -> None:
        """A send processes the socket's pending commands, and with them may take the
        edge that would have woken the reader for a subscription that just came in:
        look for one now, or it waits for the next edge (which may never come)."""
        if not self._running or self._draining:
            return
        try:
            if not int(self._sync.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                return
        except zmq.ZMQError:  # closed under us: the daemon is ending
            return
        asyncio.get_running_loop().call_soon(self._drain)
        self._draining = True

    async def run(self) -> None:
        """Read subscriptions until cancelled (edge-triggered, as the monitor reads)."""
        loop = asyncio.get_running_loop()
        fd = int(self._sync.getsockopt(zmq.FD))
        loop.add_reader(fd, self._drain)
        self._running = True
        try:
            self._drain()
            await loop.create_future()
        finally:
            self._running = False
            loop.remove_reader(fd)

    def _drain(self) -> None:
        self._draining = False
        if not self._running:
            return
        for _ in range(BATCH):
            if not int(self._sync.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                return
            try:
                message = self._sync.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._subscription(message)
        asyncio.get_running_loop().call_soon(self._drain)
        self._draining = True

    def _subscription(self, message: bytes) -> None:
        """\\x01topic subscribes, \\x00topic unsubscribes (the peer's, the last one read)."""
        if not message or message[0] not in (0, 1):
            self.refused["malformed"] += 1
            return
        topic = message[1:]
        if message[0] == 0:
            with contextlib.suppress(zmq.ZMQError):
                self._sync.setsockopt(zmq.UNSUBSCRIBE, topic)
            return
        if topic in self.known:
            pass
        elif len(topic) > MAX_TOPIC:
            self.refused["topic_too_long"] += 1
            return
        elif topic not in self.topics:
            if len(self.topics) >= MAX_TOPICS:
                self.refused["too_many_topics"] += 1
                return
            self.topics.add(topic)
        with contextlib.suppress(zmq.ZMQError):
            self._sync.setsockopt(zmq.SUBSCRIBE, topic)
