"""Job-wide agreement between the daemons of a multi-node job, as pure functions.

Every node of a job generation publishes one outcome when its generation
ends (its own decision, or the one it follows); each node then applies
``joint`` to the same set of outcomes, so all act alike without a leader:

* an abort anywhere stops every node;
* a reschedule names the node that must leave: that node exits with the
  reschedule code, the others restart and rejoin (a spare or a replacement
  takes its place);
* a reschedule because the job's restarts ran out sends every node away;
* otherwise any failure restarts every node, and only when every node
  succeeded is the job done.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from supervisor.core.policy import Budget
from supervisor.core.types import Action, Decision, Reason


class PeerNews(StrEnum):
    """What a node learns about its peers while its own ranks run."""

    ENDED = "peer_ended"  # a peer's generation failed, or its node is stopping
    WAITING = "node_waiting"  # a node asks to join: the membership changes
    LOST = "node_lost"  # a participant's keep-alive expired: its daemon is gone
    CLOSED = "rendezvous_closed"  # the job ended elsewhere


# Why a node restarts when it only follows its peers. A membership change (a
# node joining) costs no restart, as with torchrun; a lost node is a failure.
FOLLOW_REASON: dict[PeerNews, Reason] = {
    PeerNews.ENDED: Reason.PEER_FAILED,
    PeerNews.WAITING: Reason.MEMBERSHIP,
    PeerNews.LOST: Reason.NODE_LOST,
    PeerNews.CLOSED: Reason.PEER_FAILED,
}

# Outcomes that do not spend the job's restart budget by themselves: they only
# echo a failure elsewhere (which spends it) or need no failure at all.
FREE_REASONS = frozenset({Reason.MEMBERSHIP, Reason.OPERATOR_REQUEST, Reason.PEER_FAILED, Reason.STOPPED})


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """How one node's generation of a job generation ended, as published to the others."""

    node_rank: int
    action: Action  # CONTINUE: every rank of the node succeeded
    reason: Reason | None = None
    detail: str = ""
    node: str = ""  # host name, for people
    rule: str | None = None
    # its root cause only blames a peer (a reset connection, a closed pair): within a
    # membership change that is the other nodes stopping their ranks, not a failure
    peer: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "node_rank": self.node_rank,
            "action": str(self.action),
            "reason": None if self.reason is None else str(self.reason),
            "detail": self.detail,
            "node": self.node,
            "rule": self.rule,
            "peer": self.peer,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> NodeOutcome:
        """Raises ValueError (naming the field) for anything but what to_json wrote."""
        try:
            rank, action, reason = data["node_rank"], data["action"], data.get("reason")
            if not isinstance(rank, int) or isinstance(rank, bool):
                raise ValueError(f"node_rank {rank!r} is not an integer")  # noqa: TRY004 - one error type for callers
            return cls(
                node_rank=rank,
                action=Action(str(action)),
                reason=None if reason is None else Reason(str(reason)),
                detail=str(data.get("detail", "")),
                node=str(data.get("node", "")),
                rule=None if data.get("rule") is None else str(data.get("rule")),
                peer=data.get("peer") is True,
            )
        except KeyError as exc:
            raise ValueError(f"a node outcome lacks {exc.args[0]!r}") from None


def joint(own: NodeOutcome, outcomes: Iterable[NodeOutcome]) -> Action:
    """What this node does once every node of the job generation has published its outcome.

    ``outcomes`` holds every node's outcome, this node's included (and a lost
    node's as a reschedule): the same set on every node, hence the same job-wide
    result. Most severe wins, but a reschedule only sends away the node that
    asked for it.
    """
    everyone = [*outcomes, own]
    actions = {o.action for o in everyone}
    if Action.ABORT in actions:
        return Action.ABORT
    if own.action is Action.RESCHEDULE or any(_job_wide(o) for o in everyone):
        return Action.RESCHEDULE
    if actions & {Action.RESTART, Action.RESCHEDULE}:
        return Action.RESTART
    return Action.CONTINUE


def _job_wide(o: NodeOutcome) -> bool:
    # no restart left: the job as a whole must run elsewhere, not one node
    return o.action is Action.RESCHEDULE and o.reason is Reason.RESTARTS_EXHAUSTED


def spends_budget(outcomes: Iterable[NodeOutcome]) -> bool:
    """Does a restart of this job generation count against the job's --max-restarts?

    A node joining stops every node's ranks, each at its own moment: a rank still in
    a collective when its peer was stopped fails with a reset connection before its
    own daemon has heard the news. Within a membership change such a failure is its
    consequence, and costs no restart either."""
    everyone = list(outcomes)
    membership = any(o.reason is Reason.MEMBERSHIP for o in everyone)
    return any(
        o.action is not Action.CONTINUE
        and o.reason is not None
        and o.reason not in FREE_REASONS
        and not (membership and o.peer)
        for o in everyone
    )


def follow(news: PeerNews, budget: Budget, now: float, detail: str) -> Decision:
    """This node's decision when its ranks were healthy and a peer's news ended them."""
    reason = FOLLOW_REASON[news]
    if reason is not Reason.NODE_LOST or budget.remaining(now) > 0:
        # a failure elsewhere is judged (budget included) by the node that
        # failed; every node counts the job generation's restart once outcomes are known
        return Decision(Action.RESTART, reason, detail)
    return Decision(
        Action.RESCHEDULE,
        Reason.RESTARTS_EXHAUSTED,
        f"{detail}; no restart left ({budget.max_restarts} used)",
    )


def lost(
    members: Mapping[int, str],
    participants: Collection[str],
    heartbeats: Mapping[str, float],
    now: float,
    bound: float,
) -> frozenset[int]:
    """Node ranks of the job generation whose daemon is gone.

    ``members`` maps each node rank of the job generation to its rendezvous identity;
    ``participants`` and ``heartbeats`` (wall-clock seconds) are the rendezvous
    state now. A member is gone when the rendezvous dropped it, or when its last
    keep-alive is older than ``bound`` (the keep-alive interval times the
    attempts torch allows).
    """
    gone = set()
    for rank, who in members.items():
        beat = heartbeats.get(who)
        if who not in participants or beat is None or now - beat > bound:
            gone.add(rank)
    return frozenset(gone)


def look_every(nnodes: int, floor: float, job_per_second: float) -> float:
    """Seconds between one node's looks at the shared rendezvous state.

    Every node looks at least every ``floor`` seconds; in a large job each looks
    less often, so that all nodes together look about ``job_per_second`` times a
    second. A node that sees news tells every other through the store at once, so
    the job notices a change as soon as any node looks: spread over the interval,
    the N nodes' looks keep the job's detection time near ``1 / job_per_second``.
    """
    return max(floor, nnodes / job_per_second)


def ask_others_every(nnodes: int, look: float, floor: float, job_per_second: float) -> int:
    """Every how many looks (``look`` seconds apart) a node whose ranks still run asks
    whether every other node's ranks exited 0: at least every ``floor`` seconds, and all
    nodes together about ``job_per_second`` times a second. Asked at every look, the job
    asked the store 100 times a second at rest from 200 nodes on, and in the scale
    harness (256 nodes, 5 s keep-alive) keep-alives then missed their deadline until
    torch dropped nodes and the others took them for lost, in 2 runs of 5."""
    return max(1, round(look_every(nnodes, floor, job_per_second) / look))


# the fields every node of a job generation shares when it only follows (same action,
# reason and detail): one entry for all of them, with their node ranks and hosts
_SHARED = ("action", "reason", "detail", "rule", "peer")


def pack(outcomes: Iterable[NodeOutcome]) -> list[dict[str, object]]:
    """A job generation's outcomes as published once for every node: grouped by what they
    share, so 1,000 nodes that follow one failure cost one entry, not 1,000."""
    groups: dict[tuple[object, ...], tuple[dict[str, object], list[list[object]]]] = {}
    for o in outcomes:
        data = o.to_json()
        key = tuple(data[f] for f in _SHARED)
        if key not in groups:
            groups[key] = ({f: data[f] for f in _SHARED}, [])
        groups[key][1].append([o.node_rank, o.node])
    return [{**shared, "nodes": nodes} for shared, nodes in groups.values()]


def unpack(data: object) -> list[NodeOutcome]:
    """Raises ValueError for anything but what ``pack`` wrote; sorted by node rank."""
    if not isinstance(data, list):
        raise ValueError(f"a job generation's outcomes are a list, not {type(data).__name__}")  # noqa: TRY004 - one error type for callers
    out = []
    for group in data:
        if not isinstance(group, dict) or not isinstance(group.get("nodes"), list):
            raise ValueError(f"a group of outcomes without nodes: {group!r}"[:200])  # noqa: TRY004
        # what the group's nodes share is read once: every node of a 1,024-node job reads
        # every outcome after each failure (half the CPU it took node by node)
        shared = NodeOutcome.from_json({**group, "node_rank": 0, "node": ""})
        for entry in group["nodes"]:
            if not isinstance(entry, list) or len(entry) != 2:
                raise ValueError(f"a node entry is [rank, host], not {entry!r}"[:200])
            rank, host = entry
            if not isinstance(rank, int) or isinstance(rank, bool):
                raise ValueError(f"node_rank {rank!r} is not an integer")  # noqa: TRY004
            out.append(
                NodeOutcome(
                    rank, shared.action, shared.reason, shared.detail, str(host), shared.rule, shared.peer
                )
            )
    return sorted(out, key=lambda o: o.node_rank)
