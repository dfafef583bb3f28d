"""How often a node looks at the rendezvous state while a round fills.

While a round fills, torch's dynamic rendezvous looks at its shared state once a
second (``_delay(seconds=1)`` in its op executor) and its state holder serves a
state up to a second old (``cache_duration=1``): after every node has decided to
restart, the last to leave the old round and the first to join the new one each
wait out up to a second, 1.2-1.6 s for 2 nodes and 2.6 s for 4 on loopback. For
the first ``window`` seconds of a round our handler (``torch_private.PacedHandler``)
looks every ``fast`` s, uncached, slowed as MAX grows so that all nodes together
look at most ``looks`` times a second; after it (spares waiting for a place, a
node slow to come back) torch's own pace resumes.

A write that loses the race (another node wrote the state between our read and our
compare-and-set) is retried by torch at once. With a thousand nodes joining, or beating
their keep-alives, together, that is hundreds of writers rewriting a state of hundreds of
KB (270 KB at 1,024 nodes) in a loop: each write that wins makes every other one in flight
lose. A node that lost backs off first, for a random time up to a bound that doubles with
each loss in a row, up to the interval between two looks (``Pace.backoff``), then reads
the state again and writes on that.

No torch here: the handler asks a ``Window`` whether to look quickly, how long to wait
between two looks, and how long to back off after a lost write.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from supervisor.clock import SYSTEM, Clock

FAST_WINDOW = 5.0
FAST_POLL = 0.1
STORE_LOOKS = 500.0
TORCH_POLL = 1.0  # torch's own wait between two looks at the state
TORCH_CACHE = 1.0  # torch's own: how old a state its holder serves
FIRST_BACKOFF = 0.01  # the bound after a first lost write: a round trip to the store or two


@dataclass(frozen=True, slots=True)
class Pace:
    window: float = FAST_WINDOW  # seconds from the start of a round
    fast: float = FAST_POLL  # the quickest look
    looks: float = STORE_LOOKS  # the whole job's looks a second, at most
    slowest: float = TORCH_POLL  # a quick look never waits longer than torch would
    cache: float = TORCH_CACHE  # outside the window, as torch does

    def interval(self, max_nodes: int) -> float:
        return min(self.slowest, max(self.fast, max_nodes / self.looks))

    def backoff(self, losses: int, max_nodes: int, draw: float) -> float:
        """How long to wait after ``losses`` lost writes in a row; ``draw`` in [0, 1)."""
        if losses <= 0:
            return 0.0
        bound = FIRST_BACKOFF * 2.0 ** min(losses - 1, 30)
        return draw * min(bound, max(self.interval(max_nodes), FIRST_BACKOFF))


class Window:
    """The start of a round, when a node looks at the state quickly and uncached."""

    def __init__(self, pace: Pace, max_nodes: int, clock: Clock = SYSTEM) -> None:
        self.pace, self.clock, self.max_nodes = pace, clock, max_nodes
        self.interval = pace.interval(max_nodes)
        self._draw = random.Random().random  # noqa: S311 - a jitter; each node its own: a shared seed collides
        self._until = float("-inf")

    def open(self) -> None:
        self._until = self.clock.monotonic() + self.pace.window

    def close(self) -> None:
        self._until = float("-inf")

    def quick(self) -> bool:
        return self.clock.monotonic() < self._until

    def wait(self) -> None:
        """Between two quick looks (blocking: the rendezvous runs in a thread)."""
        self.clock.pause(self.interval)

    def back_off(self, losses: int) -> None:
        """After a write that lost the race (blocking, as ``wait``)."""
        self.clock.pause(self.pace.backoff(losses, self.max_nodes, self._draw()))
