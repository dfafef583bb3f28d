"""The rank's one socket to its daemon: fire and forget, never in the way.

* One DEALER per process, created lazily: ZeroMQ sockets must not cross fork,
  so a forked child (a dataloader worker) gets its own on its first send.
* Non-blocking sends with a send high-water mark: a slow, restarting or dead
  daemon costs dropped messages (counted), never a blocked training step.
* LINGER=0: exiting never waits for unsent messages (an explicit close may wait
  a bounded moment to deliver its last ones).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import orjson
import zmq

SEND_HWM = 10_000


class Channel:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.dropped = 0
        self._pid = -1
        self._socket: zmq.Socket[bytes] | None = None
        self._lock = threading.Lock()  # zmq sockets are not thread-safe

    def _connect(self) -> zmq.Socket[bytes]:
        # A fresh context too: the parent's is unusable after fork, and must
        # not be terminated from here.
        context = zmq.Context()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        sock.connect(self.endpoint)
        self._context = context
        self._socket = sock
        self._pid = os.getpid()
        return sock

    def send(self, payload: bytes) -> bool:
        with self._lock:
            sock = self._socket if self._pid == os.getpid() else None
            if sock is None:
                sock = self._connect()
            try:
                sock.send(payload, zmq.NOBLOCK)
            except zmq.ZMQError:
                self.dropped += 1  # full (daemon slow or gone): drop, never wait
                return False
            return True

    def await_ack(self, request_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the daemon to acknowledge ``request_id``."""
        return self.await_reply(request_id, timeout) is not None

    def await_reply(self, request_id: str, timeout: float) -> dict[str, Any] | None:
        """The daemon's acknowledgement of ``request_id`` (with what it answered), or None
        after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._lock:
            sock = self._socket if self._pid == os.getpid() else None
            while sock is not None and (left := deadline - time.monotonic()) > 0:
                if not sock.poll(int(left * 1000) + 1):
                    break
                try:
                    reply = orjson.loads(sock.recv(zmq.NOBLOCK))
                except (zmq.ZMQError, orjson.JSONDecodeError):
                    continue
                if isinstance(reply, dict) and reply.get("type") == "ack" and reply.get("id") == request_id:
                    return reply
        return None

    def close(self, linger_ms: int = 0) -> None:
        """Close; ``linger_ms`` bounds the wait for messages still queued."""
        with self._lock:
            if self._socket is not None and self._pid == os.getpid():
                self._socket.close(linger=linger_ms)
                self._context.term()
            self._socket = None
            self._pid = -1
