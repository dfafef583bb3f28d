"""The job's node table in the rendezvous store: each node's published status.

``ft-supervisor status`` on any node lists every node from it, and the straggler
scoring compares this node's ranks with a sample of the others'. A node takes a
slot (``nodes`` counter) when it first joins and rewrites ``node/<slot>`` when its
state changes. Reading is never on the loop and never on demand at the store's
cost: the table is read in the background when someone asks and it is over a
second old, the sample every ``sample_every(nnodes)`` seconds.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from supervisor.clock import SYSTEM, Clock

# straggler medians: SAMPLE_NODES other nodes read (2 requests each) every
# sample_every(N) s, so that the whole job makes at most SAMPLE_BUDGET of these a second
SAMPLE_NODES = 8
SAMPLE_BUDGET = 400.0
SAMPLE_MIN = 1.0
NODES_FRESH = 1.0  # seconds the node table shown by status may be old before it is read again


def sample_every(nnodes: int) -> float:
    return max(SAMPLE_MIN, nnodes * 2 * SAMPLE_NODES / SAMPLE_BUDGET)


class NodeTable:
    """This node's entry, and the others' as last read. ``store`` gives torch's store
    of the rendezvous (raising while there is none); every store call is blocking,
    made from the rendezvous' threads or from threads of this class's own."""

    def __init__(self, store: Callable[[], Any], clock: Clock = SYSTEM) -> None:
        self.host = socket.gethostname()
        self._clock = clock
        self.nnodes = 1  # the job's size at the last round: how often to sample
        self._store = store
        self._slot: int | None = None  # this daemon's entry in the table
        self._status: dict[str, Any] = {"host": self.host, "pid": os.getpid()}
        self._unpublished = False  # shared fields the watcher has not published yet
        self._nodes: list[dict[str, Any]] = []
        self._nodes_at = float("-inf")
        self._nodes_reading = False
        self._sample: list[dict[str, Any]] = []  # a few other nodes' status (straggler medians)
        self._sample_at = float("-inf")
        self._sampling = False
        self._lock = threading.Lock()

    def register(self) -> None:
        """Take a slot once (a blocking store call), and publish this node's status."""
        if self._slot is None:
            self._slot = int(self._store().add("nodes", 1)) - 1
        self._publish()

    def share(self, **fields: Any) -> None:
        """Add to this node's published status (straggler medians): the watcher publishes
        it, off the loop, at its next look at the rendezvous (about a second)."""
        with self._lock:
            self._status = {**self._status, **fields}
            self._unpublished = True

    def publish_shared(self) -> None:
        """Publish what ``note`` and ``share`` changed since the last time (blocking: called
        by the rendezvous' threads, the watcher at each look among them)."""
        if self._unpublished and self._slot is not None:
            self._publish()

    def note(self, state: str, **fields: Any) -> None:
        """Record this node's state, for the rendezvous' next thread to publish. Never a
        store call here: the daemon notes from its loop, and a store request there held
        the loop for a round trip, or for the store's patience when its host was gone
        (at 1,024 simulated nodes the failure round waited minutes on it)."""
        with self._lock:
            self._status = {**self._status, "state": state, **fields, "updated": round(self._clock.wall(), 3)}
            self._unpublished = True

    def _publish(self) -> None:
        try:
            with self._lock:
                status, self._unpublished = dict(self._status), False
            self._store().set(f"node/{self._slot}", orjson.dumps(status).decode())
        except Exception:  # status only: the next publish_shared (the watch's next look) retries
            with self._lock:
                self._unpublished = True

    def _statuses(self, slots: Callable[[int], Iterable[int]]) -> list[dict[str, Any]]:
        """The published status of the nodes ``slots`` picks among the job's table
        (two requests each: blocking, so off the loop)."""
        base = self._store()
        keys = [f"node/{i}" for i in slots(int(base.add("nodes", 0)))]
        return [orjson.loads(base.get(k)) for k in keys if base.check([k])]

    def _refresh_nodes(self) -> None:
        try:
            nodes = self._statuses(range)
            with self._lock:
                self._nodes, self._nodes_at = nodes, self._clock.monotonic()
        except Exception:  # noqa: S110 - status only; the next status asks again
            pass
        finally:
            with self._lock:
                self._nodes_reading = False

    def sample(self) -> list[dict[str, Any]]:
        """A few other nodes' published status (their straggler medians), as last read:
        SAMPLE_NODES of them, picked at random, read again in the background once the
        last read is older than sample_every(nnodes). Every node reading every other's
        would cost the store N^2 requests a round; a sample of eight nodes' ranks is
        enough for the job's typical step time."""
        with self._lock:
            age = self._clock.monotonic() - self._sample_at
            stale = age > sample_every(self.nnodes) and not self._sampling
            if stale and self._slot is not None:
                self._sampling = True
                threading.Thread(target=self._read_sample, name="rdzv-sample", daemon=True).start()
            return list(self._sample)

    def _read_sample(self) -> None:
        def picked(count: int) -> list[int]:
            others = [i for i in range(count) if i != self._slot]
            return random.sample(others, min(SAMPLE_NODES, len(others)))  # a sample, not a secret

        try:
            nodes = self._statuses(picked)
            with self._lock:
                self._sample = nodes
        except Exception:  # noqa: S110 - straggler scoring goes on against this node's ranks
            pass
        finally:
            with self._lock:
                self._sample_at, self._sampling = self._clock.monotonic(), False

    def nodes(self) -> list[dict[str, Any]]:
        """The job's node table as last read. Reading it costs the store two requests
        a node, so it is read only when someone asks (status), in the background."""
        with self._lock:
            stale = self._clock.monotonic() - self._nodes_at > NODES_FRESH and not self._nodes_reading
            if stale and self._slot is not None:
                self._nodes_reading = True
                threading.Thread(target=self._refresh_nodes, name="rdzv-nodes", daemon=True).start()
            return list(self._nodes)
