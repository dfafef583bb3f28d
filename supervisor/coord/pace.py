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

The losses are counted per operation (``Window.begin``), and a back-off never takes more
than a quarter of what is left of the operation's deadline. A keep-alive has torch's
heartbeat timeout (5 s) to land its write, and the interval between two looks can be
longer (scripts/bench/scale.py paces a 1,024-node join at 16 s). Counted per holder, the
losses of a keep-alive that failed (or of a join's storm that never ended in a win)
started the node's next keep-alive at its longest back-off, past its deadline: one
failed keep-alive made the next ones fail, until the node's heartbeat went stale and
its peers counted it lost.

No torch here: the handler asks a ``Window`` whether to look quickly, how long to wait
between two looks, and how long to back off after a lost write.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from supervisor.clock import SYSTEM, Clock

FAST_WINDOW = 5.0
FAST_POLL = 0.1
STORE_LOOKS = 500.0
TORCH_POLL = 1.0  # torch's own wait between two looks at the state
TORCH_CACHE = 1.0  # torch's own: how old a state its holder serves
FIRST_BACKOFF = 0.01  # the bound after a first lost write: a round trip to the store or two
DEADLINE_SHARE = 0.25  # a back-off takes at most this share of what is left of its operation's time


@dataclass(frozen=True, slots=True)
class Pace:
    window: float = FAST_WINDOW  # seconds from the start of a round
    fast: float = FAST_POLL  # the quickest look
    looks: float = STORE_LOOKS  # the whole job's looks a second, at most
    slowest: float = TORCH_POLL  # a quick look never waits longer than torch would
    cache: float = TORCH_CACHE  # outside the window, as torch does

    def interval(self, max_nodes: int) -> float:
        return min(self.slowest, max(self.fast, max_nodes / self.looks))

    def backoff(self, losses: int, max_nodes: int, draw: float, left: float = float("inf")) -> float:
        """How long to wait after ``losses`` lost writes in a row, ``left`` seconds before
        the operation's deadline; ``draw`` in [0, 1)."""
        if losses <= 0:
            return 0.0
        bound = FIRST_BACKOFF * 2.0 ** min(losses - 1, 30)
        return draw * min(
            bound, max(self.interval(max_nodes), FIRST_BACKOFF), max(left, 0.0) * DEADLINE_SHARE
        )


class Window:
    """The start of a round, when a node looks at the state quickly and uncached."""

    def __init__(
        self, pace: Pace, max_nodes: int, clock: Clock = SYSTEM, draw: Callable[[], float] | None = None
    ) -> None:
        self.pace, self.clock, self.max_nodes = pace, clock, max_nodes
        self.interval = pace.interval(max_nodes)
        # a jitter; each node its own: a shared seed collides (tests pass a fixed draw)
        self._draw = draw or random.Random().random  # noqa: S311
        self._until = float("-inf")
        self.losses = 0  # writes lost in a row, in the operation under way
        self._deadline = float("inf")  # that operation's: torch's, on the system's monotonic time

    def open(self) -> None:
        self._until = self.clock.monotonic() + self.pace.window

    def close(self) -> None:
        self._until = float("-inf")

    def quick(self) -> bool:
        return self.clock.monotonic() < self._until

    def wait(self) -> None:
        """Between two quick looks (blocking: the rendezvous runs in a thread)."""
        self.clock.pause(self.interval)

    def begin(self, deadline: float) -> None:
        """An operation starts (a join, a keep-alive, an exit), to end by ``deadline``:
        its losses are its own."""
        self.losses, self._deadline = 0, deadline

    def won(self) -> None:
        self.losses = 0

    def back_off(self) -> None:
        """After a write that lost the race (blocking, as ``wait``)."""
        self.losses += 1
        left = self._deadline - self.clock.monotonic()
        self.clock.pause(self.pace.backoff(self.losses, self.max_nodes, self._draw(), left))
