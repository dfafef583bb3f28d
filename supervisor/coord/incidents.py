"""A hang's incident across the job: every node's summary through the round's store.

A node that declares a hang (a missed deadline) ``declare`` s an incident before it
announces its generation's end, so every node that hears the end can ask whether it
was a hang (``declared``). One incident per round (a job generation) is enough: the
first hang ends the generation on every node, and the next round starts clean.

Every node taking part then ``exchange`` s: it publishes its ``NodeSummary``
(``supervisor.core.node_summary``, encoded, at most 64 KiB) under
``incident/summary/<node rank>`` and waits, bounded, for every node's. The first
node past its wait fixes which summaries count (``incident/members``): every node
reads the same ones, so the pure ``job_blame`` gives every node the same answer; a
summary published after that is read by nobody (its node is ``silent`` on every node).

The store is reached through a ``Board`` (async): the rendezvous round's store
(``job.RendezvousJob.board``, its calls in threads), or the fast tier's in-memory one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import orjson

from supervisor.aio import in_thread

DECLARED = "incident/declared"
AT = "incident/at"  # wall-clock seconds of the first declaration
CLOSING = "incident/closing"
MEMBERS = "incident/members"  # the node ranks whose summaries count, fixed once
WAIT = 2.0  # seconds a node waits for the others' summaries after publishing its own, at least
CLOSE_WAIT = 5.0  # seconds a node waits for the node that fixes the members to write them


class Board(Protocol):
    """The round's store as the exchange uses it."""

    async def set(self, key: str, value: bytes) -> None: ...
    async def add(self, key: str, amount: int) -> int: ...
    async def check(self, key: str) -> bool: ...
    async def get(self, key: str) -> bytes: ...
    async def wait(self, keys: list[str], seconds: float) -> bool: ...


def summary_key(node_rank: int) -> str:
    return f"incident/summary/{node_rank}"


async def declare(board: Board, node_rank: int, wall: float) -> None:
    """This node declares a hang (once, however often it says so); the first
    declaration's time is kept. ``DECLARED`` counts the nodes that declared."""
    if await board.add(f"incident/by/{node_rank}", 1) == 1 and await board.add(DECLARED, 1) == 1:
        await board.set(AT, repr(wall).encode())


async def declared(board: Board) -> float | None:
    """When the round's incident was first declared (wall clock), or None: no incident."""
    if await board.add(DECLARED, 0) < 1:
        return None
    if not await board.wait([AT], CLOSE_WAIT):
        return None
    try:
        return float(await board.get(AT))
    except ValueError:
        return None


async def exchange(
    board: Board, node_rank: int, nnodes: int, payload: bytes, *, wait: float = WAIT
) -> dict[int, bytes]:
    """Publish this node's summary; every node's that counts, by node rank (the same
    set on every node), within ``wait`` s (plus the members' fixing): as soon as every
    node's is in, or at the bound, whatever is in then."""
    await board.set(summary_key(node_rank), payload)
    keys = [summary_key(r) for r in range(nnodes)]
    await board.wait(keys, wait)  # every node's, or the bound: either way the members are fixed next
    if await board.add(CLOSING, 1) == 1:
        present = [r for r in range(nnodes) if await board.check(summary_key(r))]
        await board.set(MEMBERS, orjson.dumps(present))
    members: list[int] | None = None
    if await board.wait([MEMBERS], CLOSE_WAIT):
        try:
            got = orjson.loads(await board.get(MEMBERS))
            members = [r for r in got if isinstance(r, int) and 0 <= r < nnodes]
        except ValueError:
            members = None
    if members is None:  # the node that fixes them went away before writing: what this one sees
        members = [r for r in range(nnodes) if await board.check(summary_key(r))]
    # only the members, this node's own included only if it is one: a node whose summary
    # came late judges without it, as every other node does
    return {r: await board.get(summary_key(r)) for r in sorted(set(members))}


class StoreBoard:
    """The round's store (``torchrdzv.PatientStore``), each call in a thread of its own;
    ``guard`` turns a store that is gone into the job's end (``RendezvousJob._guard``)."""

    def __init__(self, store: Any, guard: Callable[[Callable[[], Any]], Callable[[], Any]]) -> None:
        self._store, self._guard = store, guard

    async def _do(self, fn: Callable[[], Any]) -> Any:
        return await in_thread(self._guard(fn), "rdzv-incident")

    async def set(self, key: str, value: bytes) -> None:
        await self._do(lambda: self._store.set(key, value.decode()))

    async def add(self, key: str, amount: int) -> int:
        return int(await self._do(lambda: self._store.add(key, amount)))

    async def check(self, key: str) -> bool:
        return bool(await self._do(lambda: self._store.check([key])))

    async def get(self, key: str) -> bytes:
        return bytes(await self._do(lambda: self._store.get(key)))

    async def wait(self, keys: list[str], seconds: float) -> bool:
        return bool(await self._do(lambda: self._store.wait(keys, seconds)))
