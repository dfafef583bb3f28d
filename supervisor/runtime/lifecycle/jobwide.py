"""A node's part in a job-wide generation, beyond its own ranks: what it heard from its
peers and what it publishes."""

from __future__ import annotations

import asyncio

from supervisor.coord.job import JobGeneration, JobOver
from supervisor.core.classify import Classification
from supervisor.core.jobwide import NodeOutcome, PeerNews
from supervisor.core.types import Action, Decision


def own_outcome(
    job_gen: JobGeneration, decision: Decision | None, c: Classification | None, node: str
) -> NodeOutcome:
    """This node's outcome of the job generation, as its peers will read it."""
    if decision is None:  # every rank of this node succeeded
        return NodeOutcome(job_gen.node_rank, Action.CONTINUE, node=node)
    return NodeOutcome(
        job_gen.node_rank,
        decision.action,
        decision.reason,
        decision.detail,
        node=node,
        rule=None if c is None else c.rule,
        peer=c is not None and c.peer,
    )


def heard(watch: asyncio.Future[tuple[PeerNews, str]]) -> tuple[tuple[PeerNews, str] | None, JobOver | None]:
    """What watching the peers brought: news, the job lost, or nothing yet."""
    if not watch.done():
        watch.cancel()
        return None, None
    if watch.cancelled():
        return None, None
    exc = watch.exception()
    if isinstance(exc, JobOver):
        return None, exc
    if exc is not None:
        raise exc
    return watch.result(), None
