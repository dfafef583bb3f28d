"""A job of one node, and what every job says of a generation's place in it.

``JobGeneration`` (this node's rank and world, the master for its ranks) and
``JobOver`` (the job cannot go on with this node) are the same for a job alone
and a rendezvous of daemons (``job.RendezvousJob``); ``LocalJob`` is the job
alone: no peers, no rendezvous, no torch in the daemon.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from supervisor.core.jobwide import NodeOutcome, PeerNews
from supervisor.core.types import Action, Reason
from supervisor.process.ports import free_port

if TYPE_CHECKING:
    from supervisor.coord.incidents import Board
    from supervisor.coord.torchrdzv import Joined


@dataclass(frozen=True, slots=True)
class JobGeneration:
    """One generation's place in the job."""

    generation: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    rdzv_round: int = 0
    joined: Joined | None = None  # the rendezvous round (several nodes)
    restarts_used: int = 0  # by the job so far, as the rendezvous store counts them


class JobOver(Exception):
    """The job cannot go on with this node: leave with ``action``."""

    def __init__(self, action: Action, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.action, self.reason, self.detail = action, reason, detail


class LocalJob:
    """A single-node job: no peers, no rendezvous, no torch in the daemon."""

    multi = False

    def __init__(self, master_addr: str, master_port: int | None) -> None:
        self._addr, self._port = master_addr, master_port

    async def start(self) -> bool:
        return True

    async def join(self, generation: int) -> JobGeneration:
        return JobGeneration(generation, 0, 1, self._addr, self._port or free_port())

    async def watch(self, job_gen: JobGeneration) -> tuple[PeerNews, str]:
        await asyncio.Event().wait()  # a node alone never hears news
        raise AssertionError("unreachable")

    async def announce_end(self, job_gen: JobGeneration, why: str) -> None:
        return None

    def others_done(self, generation: int) -> bool:
        return False  # there are no other nodes

    def board(self, job_gen: JobGeneration) -> Board | None:
        return None  # no peers to share a hang's evidence with

    async def agree(self, job_gen: JobGeneration, own: NodeOutcome) -> list[NodeOutcome]:
        return [own]

    async def publish(self, job_gen: JobGeneration, own: NodeOutcome) -> None:
        return None

    async def count_restart(self) -> None:
        return None

    async def finish(
        self, job_gen: JobGeneration | None, action: Action, *, job_over: bool, live: int = 1
    ) -> None:
        return None

    def note(self, state: str, **fields: Any) -> None:
        return None

    def nodes(self) -> list[dict[str, Any]]:
        return []

    def sample(self) -> list[dict[str, Any]]:
        return []

    def share(self, **fields: Any) -> None:
        """Nothing to share with: a single node."""
