"""What a node does once a generation has ended: the daemon's choices, as values.

Two moments, two pure functions. When the generation's ranks are down,
``basis_of`` says what the decision rests on: the generation simply
succeeded, an operator asked for a restart, a peer's news ended healthy ranks
(follow it), or this node's evidence must be judged (classify, then
``policy.decide``). Once every node of the job has published its outcome,
``job_outcome`` says what the job does, whether the budget pays a restart, which
node writes that down in the job's store, and the decision this node adopts
when the job's outcome is not its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from supervisor.core.evidence import WorkloadRequest
from supervisor.core.jobwide import NodeOutcome, PeerNews, follow, joint, spends_budget
from supervisor.core.policy import Budget
from supervisor.core.types import Action, Decision, Reason

OPERATOR_RESTART = Decision(Action.RESTART, Reason.OPERATOR_REQUEST, "restart requested by an operator")


class Basis(StrEnum):
    """What a node's decision on a generation rests on."""

    SUCCEEDED = "succeeded"  # every rank finished its work: nothing to decide
    OPERATOR_RESTART = "operator_restart"  # `ft-supervisor restart`: no evidence to weigh
    FOLLOW_PEER = "follow_peer"  # healthy ranks ended by a peer's news: the peer's node judges
    JUDGE = "judge"  # this node's evidence decides
    DECIDED = "decided"  # the daemon decided while the ranks ran (a straggler): nothing failed since


@dataclass(frozen=True, slots=True)
class GenerationEnd:
    """What happened to a generation on this node, as far as its basis needs it."""

    succeeded: bool  # every rank exited 0
    failed: bool  # a rank failed on its own (not only stopped by us)
    restart_requested: bool = False  # an operator's restart command
    unkillable: tuple[int, ...] = ()  # ranks that survived SIGKILL
    requests: tuple[WorkloadRequest, ...] = ()  # ranks' own requests (restart, reschedule, abort)
    peer_news: PeerNews | None = None  # what a peer's daemon announced, if anything
    reported: bool = False  # a rank reported its own failure (error file, client) as it went down
    decided: Decision | None = None  # what the daemon decided while the ranks ran (a straggler)
    blamed_elsewhere: bool = False  # the job's blame names another node's rank (core.job_blame)


def basis_of(end: GenerationEnd) -> Basis:
    """Which way this node decides. First match wins, in this order:

    an operator's restart (unless a rank cannot be killed: that needs judging);
    success with nothing asked; a decision taken while the ranks ran, unless a rank
    failed, spoke up or got stuck meanwhile (then that is judged); a peer's news
    when nothing here failed, spoke up or got stuck (a rank that failed on its own
    in the same instant says more than the news), or whatever failed here when the job's
    blame named another node's rank (a waiting rank's peer went away: a symptom); everything
    else is judged.
    """
    if end.restart_requested and not end.unkillable:
        return Basis.OPERATOR_RESTART
    if end.succeeded and not end.requests:
        return Basis.SUCCEEDED
    if end.decided is not None and not (end.failed or end.reported or end.unkillable or end.requests):
        return Basis.DECIDED
    if (
        end.peer_news is not None
        and (end.blamed_elsewhere or not (end.failed or end.reported))
        and not end.unkillable
        and not end.requests
    ):
        return Basis.FOLLOW_PEER
    return Basis.JUDGE


def without_evidence(
    which: Basis, news: PeerNews | None, budget: Budget, now: float, detail: str, *,
    decided: Decision | None = None,
) -> Decision:
    """The decision on a basis that weighs no evidence of this node."""
    if which is Basis.OPERATOR_RESTART:
        return OPERATOR_RESTART
    if which is Basis.FOLLOW_PEER and news is not None:
        return follow(news, budget, now, detail)
    if which is Basis.DECIDED and decided is not None:
        return decided
    raise ValueError(f"basis {which} needs this node's evidence")


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """The outcome to apply: the job's action, agreed by every node, and what it costs."""

    action: Action  # what the job does, the same on every node
    spends: bool  # a restart that the job's --max-restarts pays for
    records: bool  # this node writes the spent restart into the job's store (one node does)
    adopted: Decision | None  # the job's decision for this node, when it is not this node's own


def job_outcome(own: NodeOutcome, outcomes: Sequence[NodeOutcome], *, multi: bool) -> JobOutcome:
    """The job's answer to a job generation, from every node's outcome (this node's included)."""
    action = joint(own, outcomes)
    spends = action is Action.RESTART and spends_budget(outcomes)
    counters = [o.node_rank for o in outcomes if o.reason is not Reason.NODE_LOST]
    records = spends and multi and own.node_rank == min(counters, default=own.node_rank)
    adopted = None
    if action is not own.action and action is not Action.RESTART:
        adopted = adopt(action, outcomes)
    return JobOutcome(action, spends, records, adopted)


def adopt(action: Action, outcomes: Sequence[NodeOutcome]) -> Decision:
    """The decision of the node whose outcome decided this one's."""
    by = next(o for o in outcomes if o.action is action)
    return Decision(
        action, Reason.PEER_FAILED, f"node {by.node_rank} ({by.node}) decided {action}: {by.detail}"
    )
