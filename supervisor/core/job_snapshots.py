"""Snapshots across the nodes of a job: which step the whole job restores, from where,
and what one daemon may tell another about a replica.

Each node's daemon publishes, for a generation, what it holds (``NodeHeld``): its ranks'
complete steps (two at most a rank: its two slots), its retained copies of them (below),
the replicas it keeps of another node's ranks, and where it takes replicas (an endpoint
and a token). ``decide`` takes every node's and answers the newest step that every rank
of the job can have, each rank from its own node's memory or, when that node lost it,
from a peer's replica: ranks never mix steps, and a replica older than the others' newest
makes the job agree on the older one. A node missing from the round means no memory
restore at all: its ranks' steps are unknown.

A replica lags when a copy takes longer than a step, and the other ranks' two slots move
on every step: without more, a replica two steps behind has no step in common with them.
So replication follows a grid the whole job shares: each daemon sends only steps that are
multiples of the job's *stride* (``on_grid``; 1 while the copies keep up), and keeps, per
rank, its own copy of the last two steps its peer acknowledged (*retained*: the staged
copy it sent, kept instead of dropped). A lost node's replica then holds grid steps, and
every other node holds the same grid steps in its retained copies, whatever the lag, as
long as a copy takes less than a stride. The stride widens (``stride_for``) when a copy
ended a stride or more behind, and nodes learn each other's through the replicas' headers
(the widest wins); each agreement sets it to the widest that any node's recent copies
needed (``needed_stride``), so a slow spell does not widen it for the rest of the run.

Pure: no clock, no files, no sockets; ``runtime.services`` gathers and applies.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.memory_snapshots import common_step

STEPS_PER_RANK = 2  # a rank's two slots (and a replica's two, and its two retained copies)
MAX_STRIDE = 1 << 16  # steps between two replicated steps, at most
MAX_RANKS = 4096  # ranks one node publishes, its own or replicated (a node has tens)
MAX_TOKEN = 64  # characters of a receiver's token
MAX_ENDPOINT = 300  # characters of host:port
MAX_HEADER = 4096  # bytes of a header on the wire between daemons
MAX_STEP = 1 << 62


def _steps(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list) or len(raw) > STEPS_PER_RANK:
        raise ValueError(f"at most {STEPS_PER_RANK} steps a rank, not {raw!r:.80}")
    if not all(type(s) is int and 0 <= s < MAX_STEP for s in raw):
        raise ValueError(f"steps are whole numbers, not {raw!r:.80}")
    return tuple(sorted(set(raw)))


def on_grid(step: int, stride: int) -> bool:
    """Whether ``step`` is one the job replicates (and retains) with this ``stride``."""
    return step % max(stride, 1) == 0


def stride_for(lag: int, stride: int) -> int:
    """The stride after a copy acknowledged ``lag`` steps behind the rank's newest: the
    same while the copies keep up with the grid (``lag`` under a stride), else the
    smallest power of two over ``lag``: the next grid step completes only after the copy
    in flight ended, so the grid's steps are all sent and the nodes' acknowledged steps
    stay within a stride of each other."""
    if lag < stride:
        return stride
    return min(MAX_STRIDE, 1 << lag.bit_length())


def needed_stride(lags: Collection[int]) -> int:
    """The stride that copies ending ``lags`` steps behind (a node's recent ones) need."""
    return stride_for(max(lags, default=0), 1)


def read_stride(raw: Any) -> int:
    """A stride another daemon gave (a header, a record): 1 when it is not one."""
    return int(raw) if type(raw) is int and 1 <= raw <= MAX_STRIDE else 1


def _ranks_to_steps(raw: Any) -> dict[int, tuple[int, ...]]:
    if not isinstance(raw, dict) or len(raw) > MAX_RANKS:
        raise ValueError(f"a mapping of at most {MAX_RANKS} ranks expected")
    out = {}
    for key, steps in raw.items():
        if not isinstance(key, str) or not key.isdigit() or len(key) > 9:
            raise ValueError(f"rank {key!r:.20} is not a rank")
        out[int(key)] = _steps(steps)
    return out


@dataclass(frozen=True, slots=True)
class NodeHeld:
    """What one node holds for a generation, as its peers read it."""

    node_rank: int
    ranks: tuple[int, ...]  # the node's ranks in this generation
    # rank -> complete steps in its ranks' slots: this generation's ranks, and those it ran
    # before the job's order changed (torch may give a replaced node another node rank)
    held: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # another's rank -> steps
    endpoint: str | None = None  # host:port where it takes replicas and serves them back
    token: str = ""  # a sender names it in every header: only the job's daemons know it
    # rank -> the steps of its retained copies here (the grid steps its peer acknowledged)
    retained: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    stride: int = 1  # the grid this node's recent copies needed (``needed_stride``)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node_rank,
            "ranks": list(self.ranks),
            "held": {str(r): sorted(s)[-STEPS_PER_RANK:] for r, s in self.held.items()},
            "replicas": {str(r): sorted(s)[-STEPS_PER_RANK:] for r, s in self.replicas.items()},
            "endpoint": self.endpoint,
            "token": self.token,
            "retained": {str(r): sorted(s)[-STEPS_PER_RANK:] for r, s in self.retained.items()},
            "stride": self.stride,
        }

    @classmethod
    def from_json(cls, raw: Any, node_rank: int) -> NodeHeld:
        """Read a peer's record; ValueError when it is not one (or not ``node_rank``'s)."""
        if not isinstance(raw, dict) or raw.get("node") != node_rank:
            raise ValueError(f"not node {node_rank}'s record")
        ranks = raw.get("ranks")
        if not isinstance(ranks, list) or len(ranks) > MAX_RANKS or not all(type(r) is int for r in ranks):
            raise ValueError("ranks: a list of ranks expected")
        endpoint, token = raw.get("endpoint"), raw.get("token")
        if endpoint is not None and (not isinstance(endpoint, str) or len(endpoint) > MAX_ENDPOINT):
            raise ValueError("endpoint: host:port expected")
        if not isinstance(token, str) or len(token) > MAX_TOKEN:
            raise ValueError("token: a short string expected")
        retained = _ranks_to_steps(raw.get("retained", {}))  # a daemon of before: none
        return cls(node_rank, tuple(ranks), _ranks_to_steps(raw.get("held")),
                   _ranks_to_steps(raw.get("replicas")), endpoint, token, retained,
                   read_stride(raw.get("stride", 1)))  # fmt: skip


@dataclass(frozen=True, slots=True)
class JobRestore:
    """The step the job restores (None: no memory restore), and where each rank finds it:
    rank -> the node rank that holds it, and whether as a replica (else in its own node's
    memory; a replica may be on the rank's own node when the job's order changed)."""

    step: int | None
    sources: Mapping[int, tuple[int, bool]]
    why: str
    retained: tuple[int, ...] = ()  # ranks whose own node restores them from its retained copy

    def fetched(self, node_rank: int, ranks: Collection[int]) -> dict[int, int]:
        """Of ``ranks`` (the node's), those restored from a replica: rank -> the node keeping it."""
        return {r: self.sources[r][0] for r in sorted(ranks) if r in self.sources and self.sources[r][1]}

    def kept(self, ranks: Collection[int]) -> list[int]:
        """Of ``ranks`` (the node's), those restored from this node's retained copies."""
        return sorted(r for r in ranks if r in self.retained)


SLOT, RETAINED, ELSEWHERE = 0, 1, 2  # where a node holds a rank's step, the cheapest first


def decide(published: Mapping[int, NodeHeld], nnodes: int) -> JobRestore:
    """The newest step every rank of the job can have, given every node's record."""
    missing = [n for n in range(nnodes) if n not in published]
    if missing:
        why = f"node(s) {missing} published nothing in time: their ranks' steps are unknown"
        return JobRestore(None, {}, why)
    home: dict[int, int] = {}
    for node in sorted(published):
        for rank in published[node].ranks:
            home.setdefault(rank, node)
    if not home:
        return JobRestore(None, {}, "no node has ranks")
    # rank -> step -> [(how, node)]: in its own node's slots, in its own node's retained
    # copies (copied into a slot there), or on another node (fetched: a replica, or a slot or
    # retained copy of a node it ran on before the job's order changed)
    where: dict[int, dict[int, list[tuple[int, int]]]] = {rank: {} for rank in home}
    for node, record in sorted(published.items()):
        for table, how in ((record.held, SLOT), (record.retained, RETAINED), (record.replicas, ELSEWHERE)):
            for rank, steps in table.items():
                for step in steps if rank in where else ():
                    here = how if home[rank] == node or how == ELSEWHERE else ELSEWHERE
                    where[rank].setdefault(step, []).append((here, node))
    found = common_step({rank: set(steps) for rank, steps in where.items()})
    if found is None:
        newest = {rank: max(steps, default=None) for rank, steps in sorted(where.items())}
        return JobRestore(None, {}, f"no step every rank holds (newest per rank: {newest})")
    step = found
    best = {rank: min(where[rank][step]) for rank in sorted(where)}
    sources = {rank: (node, how == ELSEWHERE) for rank, (how, node) in best.items()}
    kept = tuple(rank for rank, (how, _) in best.items() if how == RETAINED)
    peers = sorted(rank for rank, (_, replica) in sources.items() if replica)
    told = f"; from a peer's replica: rank(s) {peers}" if peers else ""
    told += f"; from a retained copy: rank(s) {list(kept)}" if kept else ""
    return JobRestore(step, sources, f"step {step}, held by every rank of {len(home)}{told}", kept)


def agreed_stride(published: Mapping[int, NodeHeld]) -> int:
    """The grid the job replicates on from now: the widest any node's copies needed."""
    return max((record.stride for record in published.values()), default=1)


def left_behind(held: Mapping[int, Collection[int]], step: int | None) -> dict[int, list[int]]:
    """Of ``held`` (rank -> steps kept), the steps of a timeline the job left: newer than the
    step it agreed to restore, or all of them when it restores none (its ranks start from
    disk or afresh). Kept, they could meet the same step numbers trained again and make a
    later agreement mix two timelines; a step of the one the job goes on from never is."""
    out = {rank: sorted(s for s in steps if step is None or s > step) for rank, steps in held.items()}
    return {rank: steps for rank, steps in out.items() if steps}


def stale_replicas(node_rank: int, nnodes: int, published: Mapping[int, NodeHeld],
                   kept: Collection[int]) -> list[int]:  # fmt: skip
    """Of the ranks whose replicas this node keeps (``kept``), those nobody replicates here
    any more: the previous node in the job's order (the one that sends here) does not run
    them (the membership changed, their node is gone for good). None while that node's
    record is unknown: its ranks may be the ones kept."""
    if nnodes < 2:
        return sorted(kept)  # nobody sends replicas to a node alone
    before = (node_rank - 1) % nnodes
    if before not in published:
        return []
    return sorted(set(kept) - set(published[before].ranks))


def peer_of(node_rank: int, nnodes: int) -> int | None:
    """The node that takes this node's replicas: the next in the job's order."""
    return None if nnodes < 2 else (node_rank + 1) % nnodes


def pause(sent: int, rate: int, elapsed: float) -> float:
    """Seconds to wait before sending more, ``sent`` bytes ``elapsed`` s into a copy
    bounded to ``rate`` bytes a second (0: no bound)."""
    return 0.0 if rate <= 0 else max(0.0, sent / rate - elapsed)


@dataclass(frozen=True, slots=True)
class Offer:
    """A replica a daemon offers (or asks back), as its header says."""

    kind: str  # "replica" (to keep) or "fetch" (to serve back)
    token: str
    node: int  # the sender's node rank
    rank: int
    step: int
    nbytes: int = 0
    checksum: str = ""
    stride: int = 1  # the sender's grid (a header without one: 1)


def read_offer(raw: Any, token: str, *, limit: int) -> Offer | str:
    """The offer in a header, or why it is refused: checked before anything is written."""
    why = _refusal(raw, token)
    if why is not None:
        return why
    node, rank, step = (int(raw[k]) for k in ("node", "rank", "step"))
    if raw["kind"] == "fetch":
        return Offer("fetch", token, node, rank, step)
    nbytes, checksum = raw.get("bytes"), raw.get("checksum")
    if type(nbytes) is not int or not 0 < nbytes <= limit:
        return f"{nbytes!r:.20} bytes: more than the {limit} this receiver has room for, or none"
    if not isinstance(checksum, str) or not 0 < len(checksum) <= 32:
        return "a checksum is a short string"
    return Offer("replica", token, node, rank, step, nbytes, checksum, read_stride(raw.get("stride", 1)))


def _refusal(raw: Any, token: str) -> str | None:
    if not isinstance(raw, dict):
        return "a header is a mapping"
    kind = raw.get("kind")
    if kind not in ("replica", "fetch"):
        return f"unknown kind {kind!r:.20}"
    if raw.get("token") != token:
        return "a token not this receiver's (another job or run)"
    if not all(type(raw.get(k)) is int and 0 <= raw[k] < MAX_STEP for k in ("node", "rank", "step")):
        return "node, rank and step are whole numbers"
    return None


def confirm(ready: Mapping[int, Any], nnodes: int) -> tuple[int | None, str]:
    """The step every node is ready to restore (each holds its ranks' own, fetched what it
    lacked), from every node's second record (``{"step": int | None, "why": str}``): one
    node short or another step means no memory restore, not a job that mixes steps."""
    missing = [n for n in range(nnodes) if n not in ready]
    if missing:
        return None, f"node(s) {missing} did not say in time that they are ready"
    steps = {r.get("step") if isinstance(r, dict) else None for r in ready.values()}
    if len(steps) == 1 and type(next(iter(steps))) is int:
        step = next(iter(steps))
        return step, f"step {step}, ready on all {nnodes} nodes"
    whys = {n: r.get("why") if isinstance(r, dict) else "unreadable" for n, r in sorted(ready.items())
            if not isinstance(r, dict) or r.get("step") is None}  # fmt: skip
    return None, f"the nodes are not ready for one step: {whys or sorted(steps, key=str)}"
