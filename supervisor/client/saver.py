"""The rank's side of the dying gasp: a thread that waits for "save now".

The training loop cannot be relied on to read a request: when the daemon is
about to stop a rank, that rank is often blocked in a collective whose peer is
gone. So the request goes to a socket of its own, served by a daemon thread
that runs the registered callback and answers with how it went. Torch releases
the GIL while it waits in a collective, so the thread runs meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import orjson
import zmq

from supervisor.transport.schema import encode

REGISTER_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class SaveRequest:
    """What the daemon said: why ranks are being stopped, and the seconds given to save."""

    reason: str
    deadline: float


SaveCallback = Callable[[SaveRequest], object]


class Saver:
    def __init__(self, endpoint: str, rank: int, gen: int, key: str, callback: SaveCallback) -> None:
        self.callback: SaveCallback | None = callback
        self.pid = os.getpid()
        self._endpoint = endpoint
        self._rank = rank
        self._gen = gen
        self._key = key
        self.registered = False  # the daemon acknowledged: it will ask this socket
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="ft-supervisor-saver", daemon=True)
        self._thread.start()
        # on_save returns once the daemon knows (or gave no answer in time)
        self._ready.wait(REGISTER_TIMEOUT + 1.0)

    def _serve(self) -> None:
        context = zmq.Context()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self._endpoint)
        registration = uuid.uuid4().hex[:16]
        sock.send(encode("saver", rank=self._rank, gen=self._gen, k=self._key, pid=self.pid, id=registration))
        if not sock.poll(int(REGISTER_TIMEOUT * 1000)):
            self._ready.set()  # no answer (a daemon too old or too busy): keep listening anyway
        while True:
            try:
                raw = sock.recv()
            except zmq.ZMQError:
                return
            with contextlib.suppress(orjson.JSONDecodeError, TypeError, ValueError):
                message = orjson.loads(raw)
                if not isinstance(message, dict):
                    continue
                if message.get("type") == "ack" and message.get("id") == registration:
                    self.registered = True
                    self._ready.set()
                elif message.get("type") == "save":
                    sock.send(self._save(message))

    def _save(self, message: dict[str, object]) -> bytes:
        deadline = message.get("deadline")
        request = SaveRequest(
            reason=str(message.get("reason", ""))[:4096],
            deadline=float(deadline) if isinstance(deadline, int | float) else 0.0,
        )
        started = time.monotonic()
        callback, ok, error = self.callback, True, ""
        if callback is None:
            ok, error = False, "the rank unregistered its save callback"
        else:
            try:
                callback(request)
            except Exception as exc:
                ok, error = False, f"{type(exc).__name__}: {exc}"[:4096]
        return encode(
            "saved",
            rank=self._rank,
            gen=self._gen,
            k=self._key,
            id=str(message.get("id", ""))[:64],
            ok=ok,
            error=error,
            seconds=round(time.monotonic() - started, 6),
        )
