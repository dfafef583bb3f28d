"""Events of a job across nodes: the rendezvous, the job-wide agreement, moves."""

from __future__ import annotations

from typing import Any

from supervisor.core.catalogue.base import WARNING, Event


class RendezvousJoined(Event, name="rendezvous_joined"):
    """This node joined a rendezvous round: its node rank and the job's master."""

    generation: int
    round: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    restarts_used: int


class RendezvousFallback(Event, name="rendezvous_fallback", level=WARNING):
    """A torch this daemon does not know: the rendezvous runs at torch's own pace and keep-alive."""

    torch: str
    why: str


class RendezvousLeaveFailed(Event, name="rendezvous_leave_failed", level=WARNING):
    """This node could not tell the rendezvous it left (the others notice by timeout)."""

    error: str


class JobDecision(Event, name="job_decision"):
    """The job-wide action the nodes agreed on, and each node's outcome."""

    generation: int
    action: str
    outcomes: list[dict[str, Any]]


class JobOver(Event, name="job_over", level=WARNING):
    """The job ends on every node: the agreed action and why."""

    action: str
    reason: str
    detail: str


class PeerNews(Event, name="peer_news", level=WARNING):
    """Another node failed or left: this node's generation ends too."""

    generation: int
    news: str
    detail: str


class NodeMoved(Event, name="node_moved"):
    """This node's rank or the job's node count changed at a new round."""

    generation: int
    node_rank: int
    nnodes: int
    was_node_rank: int
    was_nnodes: int


class JobBlame(Event, name="job_blame", level=WARNING):
    """A job-wide hang's one blame from every node's summary, the same on every node.

    The rule that decided, the culprit ranks and their nodes, the nodes that gave no
    summary, and the seconds from the first node's declaration to this node's verdict:
    of those, ``gathered`` this node's own evidence (stacks, dumps), ``exchanged`` from
    publishing its summary to holding every node's that counts."""

    generation: int
    rule: str
    ranks: list[int]
    nodes: list[int]
    silent: list[int]
    waiting: list[int]
    detail: str
    mismatch: dict[str, Any] | None
    summaries: list[int]  # the nodes whose summary counted
    seconds: float | None
    gathered: float | None = None
    exchanged: float | None = None
