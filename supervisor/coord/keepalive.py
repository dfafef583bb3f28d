"""The rendezvous keep-alive, each node at its own phase.

torch's dynamic rendezvous starts every node's keep-alive timer when the round
completes, and a keep-alive rewrites the whole rendezvous state by
compare-and-set. So every ``keep_alive_interval`` the whole job writes at the
same instant, and each success makes every other writer's attempt stale: at 256
simulated nodes with torch's 5 s, 2.5 compare-and-sets of the whole state per
keep-alive (``scripts/bench/scale.py``), and the more nodes, the more attempts
each. A node whose keep-alives keep failing for ``keep_alive_max_attempt``
intervals is counted gone: a healthy node lost, a whole job rescheduled. The
same burst comes back after every restart (every round completes for all nodes
at once).

Here a node's first beat after a round falls at a random point of the
interval; later beats keep that phase, so the job's writes are spread evenly
(one compare-and-set per keep-alive at 256 nodes).
The beat itself is torch's (``_keep_alive``: its lock, its deadline, its
logging); ``torch_private.PacedHandler`` starts this timer where torch would
start its own, and stops it where torch would stop its own (the next round,
shutdown). No torch here: the timer calls what it is given.
"""

from __future__ import annotations

import random
import threading
import weakref
from collections.abc import Callable
from typing import Any

RNG = random.Random()  # noqa: S311 - a phase, not a secret; tests seed it


class Phased:
    """A keep-alive timer: ``beat(owner)`` first ``first`` seconds after it starts,
    then every ``interval``, while ``owner`` lives (held weakly: a timer must not
    keep a handler, and its rendezvous, alive)."""

    def __init__(self, owner: Any, beat: Callable[[Any], None], interval: float, first: float) -> None:
        self._owner = weakref.ref(owner)
        self._beat = beat
        self._interval = interval
        self._first = first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rdzv-keep-alive", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        wait = self._first
        while not self._stop.wait(wait):
            owner = self._owner()
            if owner is None:  # the handler is gone: so is its rendezvous
                return
            self._beat(owner)
            del owner
            wait = self._interval


def phase(interval: float) -> float:
    """When a node's first beat after a round comes: anywhere in the interval."""
    return RNG.uniform(0.0, interval)
