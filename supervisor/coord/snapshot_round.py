"""What each node of a rendezvous round publishes about its snapshots, and gathers of
the others' (``supervisor.core.job_snapshots``): one key per node under the round's
prefix, ``snapshots/<node rank>``, a compact record (two steps a rank at most in its slots,
two in its retained copies, two in the replicas it keeps).

Blocking: called from the daemon's threads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from supervisor.clock import SYSTEM, Clock
from supervisor.core.job_snapshots import NodeHeld

if TYPE_CHECKING:
    from supervisor.coord.torchrdzv import Joined

WAIT_SLICE = 0.25  # seconds a wait for the missing keys lasts before what is there is read


def key(node_rank: int) -> str:
    return f"snapshots/{node_rank}"


def publish(joined: Joined, held: NodeHeld) -> None:
    joined.store.set(key(held.node_rank), orjson.dumps(held.to_json()).decode())


def gather(joined: Joined, nnodes: int, timeout: float, clock: Clock = SYSTEM) -> dict[int, NodeHeld]:
    """Every node's record, waiting at most ``timeout`` s for all of them; a node whose
    record is missing or unreadable by then is left out (``decide`` then says which)."""
    keys = [key(n) for n in range(nnodes)]
    _wait(joined, keys, timeout, clock)
    out: dict[int, NodeHeld] = {}
    for n, k in enumerate(keys):
        if not joined.store.check([k]):
            continue
        try:
            out[n] = NodeHeld.from_json(orjson.loads(joined.store.get(k)), n)
        except ValueError:  # orjson's errors are ValueErrors too: a record we cannot read
            continue
    return out


def ready_key(node_rank: int) -> str:
    return f"snapshots-ready/{node_rank}"


def publish_ready(joined: Joined, node_rank: int, step: int | None, why: str) -> None:
    joined.store.set(ready_key(node_rank), orjson.dumps({"step": step, "why": why[:300]}).decode())


def gather_ready(joined: Joined, nnodes: int, timeout: float, clock: Clock = SYSTEM) -> dict[int, object]:
    """Every node's readiness (``core.job_snapshots.confirm``'s input), waiting at most ``timeout`` s."""
    keys = [ready_key(n) for n in range(nnodes)]
    _wait(joined, keys, timeout, clock)
    out: dict[int, object] = {}
    for n, k in enumerate(keys):
        if joined.store.check([k]):
            try:
                out[n] = orjson.loads(joined.store.get(k))
            except ValueError:
                out[n] = None
    return out


def _wait(joined: Joined, keys: list[str], timeout: float, clock: Clock) -> None:
    deadline = clock.monotonic() + timeout
    while not joined.store.check(keys):
        left = deadline - clock.monotonic()
        if left <= 0:
            return
        joined.store.wait(keys, min(left, WAIT_SLICE))  # the store answers when all are set
