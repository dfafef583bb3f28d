"""A fake multi-node job for the fast tier: this node's view of a rendezvous of daemons.

The daemon asks a job to ``join`` each generation's round (its node rank, the world,
the restarts the job has spent), to ``watch`` its peers while its ranks run, and to
``agree`` on every node's outcome when the generation ended. ``ScriptedJob`` answers
from a script of ``Round`` s, one a generation: the place this node gets, the news a
peer sends some virtual seconds into the generation, and what the other nodes
published. What the daemon told the job (announcements, counted restarts, its
leaving) is kept to assert on. No store, no torch: the rendezvous itself stays in
tests/integration/test_multinode.py. A hang's incident goes through ``MemoryBoard``,
an in-memory store on the loop's (virtual) time, where scripted ``Peer`` s declare and
publish their summaries (or do not) as the other nodes would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor.coord import incidents
from supervisor.coord.local import JobGeneration, LocalJob
from supervisor.core.jobwide import NodeOutcome, PeerNews
from supervisor.core.node_summary import NodeSummary, encode
from supervisor.core.types import Action, Reason

Others = Callable[[NodeOutcome, int], Sequence[NodeOutcome]]  # this node's outcome, the world


def follow(reason: Reason = Reason.PEER_FAILED) -> Others:
    """The other nodes' outcomes when they only follow this one: each restarts for
    ``reason`` if this node failed, and succeeds if it succeeded."""

    def others(own: NodeOutcome, nnodes: int) -> Sequence[NodeOutcome]:
        ranks = [n for n in range(nnodes) if n != own.node_rank]
        if own.action is Action.CONTINUE:
            return [NodeOutcome(n, Action.CONTINUE, node=f"node{n}") for n in ranks]
        return [NodeOutcome(n, Action.RESTART, reason, f"node {own.node_rank} failed", node=f"node{n}")
                for n in ranks]  # fmt: skip

    return others


@dataclass(frozen=True)
class Peer:
    """Another node in a hang's incident: its summary (None: it never answers), published
    ``after`` seconds once this node published its own; ``declares``: it declared the
    incident before this node looked."""

    summary: NodeSummary | None
    after: float = 0.0
    declares: bool = False


class MemoryBoard:
    """The round's store for an incident, in memory: waits end when their keys are set
    or on the loop's (virtual) clock."""

    def __init__(self, node_rank: int, peers: Sequence[Peer]) -> None:
        self.kv: dict[str, bytes] = {}
        self._changed = asyncio.Event()
        self._node_rank, self._peers = node_rank, peers
        for peer in peers:
            if peer.declares:
                self.kv[incidents.DECLARED] = b"1"
                self.kv.setdefault(incidents.AT, repr(0.0).encode())

    def _put(self, key: str, value: bytes) -> None:
        self.kv[key] = value
        self._changed.set()
        self._changed = asyncio.Event()

    async def set(self, key: str, value: bytes) -> None:
        self._put(key, value)
        if key == incidents.summary_key(self._node_rank):  # the others answer from now on
            loop = asyncio.get_running_loop()
            for peer in self._peers:
                if peer.summary is not None:
                    key_, data = incidents.summary_key(peer.summary.node_rank), encode(peer.summary)
                    loop.call_later(peer.after, self._put, key_, data)

    async def add(self, key: str, amount: int) -> int:
        value = int(self.kv.get(key, b"0")) + amount
        self._put(key, str(value).encode())
        return value

    async def check(self, key: str) -> bool:
        return key in self.kv

    async def get(self, key: str) -> bytes:
        return self.kv[key]

    async def wait(self, keys: list[str], seconds: float) -> bool:
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        while not all(k in self.kv for k in keys):
            left = until - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return False
        return True


@dataclass
class Round:
    """One generation of the job, as this node sees it."""

    node_rank: int = 0
    nnodes: int = 2
    restarts_used: int = 0  # by the job so far, as the store counts them
    news: tuple[float, PeerNews, str] | None = None  # seconds into the generation, what, detail
    # the other nodes' outcomes: given, or computed from this node's (by default they follow it)
    others: Sequence[NodeOutcome] | Others | None = None
    # seconds into the generation after which every other node has published that its
    # ranks all exited 0 (``others_done``); None: never while this node's ranks run
    others_done_after: float | None = None
    peers: Sequence[Peer] = ()  # the other nodes in a hang's incident


@dataclass
class Told:
    """What the daemon told the job."""

    joined: list[JobGeneration] = field(default_factory=list)
    announced: list[tuple[int, str]] = field(default_factory=list)
    agreed: list[NodeOutcome] = field(default_factory=list)  # this node's own outcome, a generation each
    published: list[NodeOutcome] = field(default_factory=list)
    counted: int = 0  # restarts this node recorded for the job
    finished: list[tuple[int | None, Action, bool]] = field(default_factory=list)


class ScriptedJob(LocalJob):
    """One node of a multi-node job whose other nodes follow a script (the last
    ``Round`` holds for every later generation)."""

    multi = True

    def __init__(self, *rounds: Round) -> None:
        super().__init__("127.0.0.1", 29500)
        self.rounds = rounds or (Round(),)
        self.told = Told()
        self._joined_at: dict[int, float] = {}  # generation -> when this node joined it (loop time)
        self.boards: dict[int, MemoryBoard] = {}  # generation -> its incident's store

    def round(self, generation: int) -> Round:
        return self.rounds[min(generation, len(self.rounds) - 1)]

    async def join(self, generation: int) -> JobGeneration:
        r = self.round(generation)
        job_gen = JobGeneration(generation, r.node_rank, r.nnodes, "127.0.0.1", 29500 + generation,
                                rdzv_round=generation, restarts_used=r.restarts_used)  # fmt: skip
        self.told.joined.append(job_gen)
        self._joined_at[generation] = asyncio.get_running_loop().time()
        return job_gen

    def others_done(self, generation: int) -> bool:
        after = self.round(generation).others_done_after
        at = self._joined_at.get(generation)
        return after is not None and at is not None and asyncio.get_running_loop().time() - at >= after

    def board(self, job_gen: JobGeneration) -> MemoryBoard:
        if job_gen.generation not in self.boards:
            peers = self.round(job_gen.generation).peers
            self.boards[job_gen.generation] = MemoryBoard(job_gen.node_rank, peers)
        return self.boards[job_gen.generation]

    async def watch(self, job_gen: JobGeneration) -> tuple[PeerNews, str]:
        news = self.round(job_gen.generation).news
        if news is None:
            return await super().watch(job_gen)  # never
        after, what, detail = news
        await asyncio.sleep(after)
        return what, detail

    async def announce_end(self, job_gen: JobGeneration, why: str) -> None:
        self.told.announced.append((job_gen.generation, why))

    async def agree(self, job_gen: JobGeneration, own: NodeOutcome) -> list[NodeOutcome]:
        self.told.agreed.append(own)
        others = self.round(job_gen.generation).others
        if others is None:
            others = follow()
        theirs = others(own, job_gen.nnodes) if callable(others) else others
        return sorted([own, *theirs], key=lambda o: o.node_rank)

    async def publish(self, job_gen: JobGeneration, own: NodeOutcome) -> None:
        self.told.published.append(own)

    async def count_restart(self) -> None:
        self.told.counted += 1

    async def finish(
        self, job_gen: JobGeneration | None, action: Action, *, job_over: bool, live: int = 1
    ) -> None:
        self.told.finished.append((None if job_gen is None else job_gen.generation, action, job_over))

    def nodes(self) -> list[dict[str, Any]]:
        return [{"node_rank": j.node_rank, "nnodes": j.nnodes} for j in self.told.joined[-1:]]
