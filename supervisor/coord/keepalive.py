"""torch's rendezvous keep-alive, each node at its own phase.

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
logging), and torch's own ``_stop_heartbeats`` stops it, at the next round and
at shutdown. ``tests/component/test_rendezvous.py`` fails the day torch
renames what this relies on.
"""

from __future__ import annotations

import random
import threading
import weakref
from typing import Any

RNG = random.Random()  # noqa: S311 - a phase, not a secret; tests seed it


class Phased:
    """A keep-alive timer with torch's ``_PeriodicTimer``'s ``cancel``, whose first
    beat comes ``first`` seconds after it starts, then every ``interval``."""

    def __init__(self, handler: Any, interval: float, first: float) -> None:
        self._handler = weakref.ref(handler)
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
            handler = self._handler()
            if handler is None:  # the handler is gone: so is its rendezvous
                return
            handler._keep_alive()
            del handler
            wait = self._interval


def dephase(handler: Any) -> Phased:
    """Replace the keep-alive timer torch just started for ``handler`` (a
    ``DynamicRendezvousHandler`` whose round completed) by one at a random phase."""
    interval = handler._settings.keep_alive_interval.total_seconds()
    handler._stop_heartbeats()
    timer = Phased(handler, interval, RNG.uniform(0.0, interval))
    handler._keep_alive_timer = timer
    timer.start()
    return timer
