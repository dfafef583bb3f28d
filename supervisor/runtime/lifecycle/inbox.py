"""The ranks' socket: their messages read, admitted or dropped, and replies sent back.

A message is admitted when it is well formed, from a rank of this node, of the
current generation, and signed with that rank's own key; anything else is
counted by reason (and said once per reason). Replies (acknowledgements, the
answers to questions, "save now") go back to the sender's identity.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections import Counter
from collections.abc import Callable

import zmq
import zmq.asyncio

from supervisor.clock import Clock
from supervisor.core.catalogue.ranks import MessageDropped
from supervisor.core.topology import rank_key
from supervisor.runtime.records.events import EventLog
from supervisor.transport import schema
from supervisor.transport.schema import Dropped, DropReason

DRAIN = 1000  # messages handled per wake-up before letting the loop run other work
MAX_CATCH_UP = 100_000  # read at once before a deadline is judged (a full socket queue)


class Inbox:
    def __init__(
        self, sock: zmq.asyncio.Socket, *, secret: bytes, clock: Clock, events: EventLog,
        deliver: Callable[[schema.RankMessage, float], None],
    ) -> None:  # fmt: skip
        self._sock = sock
        # the same socket, without asyncio: draining what is queued needs no wake-up
        self._sync: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        self._secret = secret  # every rank's key derives from it (core.topology.rank_key)
        self._clock, self._events, self._deliver = clock, events, deliver
        self.ranks: frozenset[int] = frozenset()  # whose messages are admitted...
        self.generation: int | None = None  # ...of this generation
        self._keys: dict[int, str] = {}  # this generation's, by rank
        self.identity: bytes | None = None  # the sender of the message being handled
        self.drops: Counter[DropReason] = Counter()
        self.received = 0

    def expect(self, generation: int | None, ranks: frozenset[int]) -> None:
        self.generation, self.ranks, self._keys = generation, ranks, {}

    async def run(self) -> None:
        """Read the ranks' messages until cancelled.

        ZeroMQ's FD is edge-triggered: one wake-up says "something changed",
        so each wake-up drains what is queued with plain non-blocking reads. An
        asyncio future per message (zmq.asyncio's recv) cost 15x more CPU.
        """
        loop = asyncio.get_running_loop()
        fd = int(self._sync.getsockopt(zmq.FD))
        loop.add_reader(fd, self._drain)
        try:
            self._drain()  # anything queued before the reader was in place
            await loop.create_future()  # forever: the work happens in _drain
        finally:
            loop.remove_reader(fd)

    def drain_now(self) -> None:
        """Read what is queued, at once and all of it (bounded by the socket's queue)."""
        for _ in range(MAX_CATCH_UP // DRAIN):
            if not int(self._sync.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                return
            self._read_batch()

    def _drain(self) -> None:
        if self._read_batch():
            # more queued: no new edge will come for it, so come back on the next turn
            asyncio.get_running_loop().call_soon(self._drain)

    def _read_batch(self) -> bool:
        """Up to DRAIN messages; True when more may be queued."""
        sock = self._sync
        for _ in range(DRAIN):
            if not int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                return False
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return False
            self.receive(frames)
        return True

    def receive(self, frames: list[bytes]) -> None:
        """One message as read from the socket: the sender's identity, then the payload."""
        self.received += 1
        try:
            message = self._admit(frames)
        except Dropped as dropped:
            self.drop(dropped)
            return
        self.identity = frames[0]
        self._deliver(message, self._clock.monotonic())

    def _admit(self, frames: list[bytes]) -> schema.RankMessage:
        if len(frames) != 2:
            raise Dropped(DropReason.MALFORMED, f"{len(frames)} frames")
        m, key = schema.decode_signed(frames[1])
        if m.rank not in self.ranks:
            raise Dropped(DropReason.UNKNOWN_RANK, f"rank {m.rank}")
        if m.gen != self.generation:
            raise Dropped(DropReason.STALE_GENERATION, f"generation {m.gen}, now {self.generation}")
        # anything of the same user can reach the socket: only the rank's own key counts
        if key is None or not hmac.compare_digest(key, self._key(m.gen, m.rank)):
            raise Dropped(DropReason.UNAUTHENTICATED, f"rank {m.rank}: {'a wrong' if key else 'no'} key")
        return m

    def _key(self, generation: int, rank: int) -> str:
        found = self._keys.get(rank)
        if found is None:
            found = self._keys[rank] = rank_key(self._secret, generation, rank)
        return found

    def drop(self, dropped: Dropped) -> None:
        self.drops[dropped.reason] += 1
        if self.drops[dropped.reason] == 1:  # once per reason; the rest are counted
            self._events.emit(MessageDropped(reason=str(dropped.reason), detail=dropped.detail))

    def ack(self, request_id: str | None, **data: object) -> None:
        """A request is worth a reply: the rank may be about to exit and wants it delivered."""
        self.reply(self.identity, request_id, **data)

    def reply(self, identity: bytes | None, request_id: str | None, **data: object) -> None:
        """The answer to ``identity``'s request: given later, after other messages were read."""
        if identity is not None and request_id is not None:
            reply = schema.encode("ack", id=request_id, **data)
            with contextlib.suppress(zmq.ZMQError):
                self._sync.send_multipart([identity, reply], zmq.NOBLOCK)

    def send(self, identity: bytes, payload: bytes) -> bool:
        """A request of the daemon's own ("save now"); False when the send failed."""
        try:
            self._sync.send_multipart([identity, payload], zmq.NOBLOCK)
            # the send may have taken the edge meant for a message that just came in
            if int(self._sync.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                asyncio.get_running_loop().call_soon(self._drain)
        except zmq.ZMQError:
            return False
        return True
