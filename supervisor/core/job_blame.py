"""One blame for the whole job, from every node's summary: the same answer on every node.

A node sees only its own ranks: when the stuck rank is elsewhere, all it sees is
healthy ranks waiting in a collective. Every node publishes its ``NodeSummary``
(``supervisor.core.node_summary``) for the incident; every node then calls::

    verdict = job_blame(summaries, expected_nodes={0: [0, 1], 1: [2, 3]})
    verdict.ranks     # the culprit ranks, the root cause first ((), when none is named)
    verdict.nodes     # the node ranks they run on
    verdict.silent    # the nodes that gave no summary (evidence, whichever rule decided)
    verdict.rule      # which rule decided (below)
    verdict.mismatch  # for a desync: the group, sequence number and what each rank called
    to_json(verdict)  # for job-blame.json and the event

``expected_nodes`` maps each node rank of the generation to the global ranks it
runs; a node without a summary did not answer within the bound, which is evidence
itself. The answer depends only on the values given, never on their order: the
summaries are read in node order and every tie is broken by rank.

The rules, the first that names someone decides:

1. ``desync``: at the same sequence number of a group, ranks issued different
   collectives, or the same one with different input sizes (a program error no
   restart fixes). The ranks that differ from the most common call are named. A rank
   whose receive caught a size mismatch (gloo: "8 vs 4. Received data size doesn't
   match") held the smaller buffer: it counts for the smallest call; with no majority
   still, every rank of the tied calls is named (none favoured by its number). Sizes are
   compared only where the inputs must agree. A caught mismatch that the dumps do not
   show (the ranks that could tell exited first): ``_witnessed``.
2. ``wavefront``: in a group, ranks that enqueued fewer collectives than the
   group's furthest rank are behind; one behind that itself waits at the front of
   another group's collectives is not the cause, the chain is followed to the ranks
   behind that wait for nobody (NVRx's attribution and torch's fr_trace read dumps alike).
3. ``absent``: every rank that answered waits in the default group's collective,
   and some ranks of the job gave no dump (stopped, exited before the incident, no
   recorder, on a node that did not answer): they are the ones waited for. A rank
   that exited after the incident began is never one of them: it exited because of it.
4. ``own_code``: no recorder verdict; by their stacks, the ranks at the most suspect
   place (gone before the incident, then stopped, then their own code) while others
   wait in a collective (or inside backward, where DDP waits for its all-reduce). A
   rank that exited after the incident began (``ended``) ranks below every waiting
   one: a SIGSTOPped rank is named, not the peers that gave up on it.
5. ``node_silent``: a node did not answer and no rule above named anyone: its ranks.
6. ``progress``: the ranks whose last reported iteration is behind the rest.
7. ``undetermined``: nothing told the ranks apart; ``ranks`` is empty.

Why not torch's own analyzer (``torch.distributed.flight_recorder``): it needs every
rank's whole dump in one process (not a 64 KiB summary per node), reports the
culprit only in its log text, stops on a missing dump unless told otherwise, and
in torch 2.13 fails on gloo dumps (their ``pg_config`` has no group name). Its
rules are the ones applied here: match by (group, sequence number), a missing
rank, a collective type or size mismatch.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.node_summary import PLACES, Call, NodeSummary, RankState
from supervisor.core.notable import says_mismatch

DEFAULT_GROUP = "0"  # the default process group's name in every dump: the whole job
# collectives whose ranks must pass inputs of the same shapes
SIZED = frozenset(
    {
        "all_reduce",
        "allreduce",
        "broadcast",
        "reduce",
        "all_gather",
        "allgather",
        "_allgather_base",
        "all_gather_into_tensor",
        "reduce_scatter",
        "_reduce_scatter_base",
        "reduce_scatter_tensor",
        "barrier",
        "allreduce_coalesced",
    }
)
WAITS = ("compute", "collective")  # where a rank waits for its peers, per its stacks
INNOCENT = (*WAITS, "ended")  # and where a rank is not the one waited for


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A desync: what each rank called at the same sequence number of a group."""

    group: str
    seq: int
    calls: tuple[tuple[int, str | None, str, str | None], ...]  # (rank, op, sizes, call site)


@dataclass(frozen=True, slots=True)
class JobBlame:
    ranks: tuple[int, ...]  # the culprits, root cause first
    nodes: tuple[int, ...]  # their nodes
    rule: str  # desync | wavefront | absent | own_code | node_silent | progress | undetermined
    detail: str
    silent: tuple[int, ...] = ()  # nodes that gave no summary
    waiting: tuple[int, ...] = ()  # ranks seen waiting for the others
    mismatch: Mismatch | None = None
    truncated: tuple[int, ...] = field(default=())  # nodes whose summary was cut to its bound

    @property
    def undetermined(self) -> bool:
        return not self.ranks


def job_blame(summaries: Iterable[NodeSummary], expected_nodes: Mapping[int, Sequence[int]]) -> JobBlame:
    """Name the culprit ranks and nodes of one incident from every node's summary."""
    by_node = _one_per_node(summaries)
    ranks: dict[int, RankState] = {}
    node_of: dict[int, int] = {}
    for n, s in by_node.items():
        for r in s.ranks:
            if r.rank not in ranks:  # a rank reported twice: the lower node's word
                ranks[r.rank], node_of[r.rank] = r, n
    # a node's own summary says which ranks it runs (nodes may run different numbers of
    # ranks); the expected layout only places the ranks nobody reported
    expected_nodes = {n: [r for r in rs if r not in node_of] for n, rs in expected_nodes.items()}
    for n, rs in sorted(expected_nodes.items()):
        for rank in rs:
            node_of.setdefault(rank, n)
    silent = tuple(sorted(set(expected_nodes) - set(by_node)))
    expected = sorted({r for rs in expected_nodes.values() for r in rs} | set(ranks))
    waiting = tuple(sorted(r.rank for r in ranks.values() if _waits(r)))
    truncated = tuple(n for n, s in by_node.items() if s.truncated)

    def verdict(
        culprits: Sequence[int], rule: str, detail: str, mismatch: Mismatch | None = None
    ) -> JobBlame:
        nodes = sorted({node_of[r] for r in culprits if r in node_of})
        if silent:
            detail += f"; node(s) {_list(silent)} did not answer"
        return JobBlame(tuple(culprits), tuple(nodes), rule, detail, silent, waiting, mismatch, truncated)

    if (found := _desync(ranks)) is not None:
        culprits, m, detail = found
        return verdict(culprits, "desync", detail, m)
    for rule, judge in (("wavefront", _wavefront), ("absent", _absent), ("own_code", _own_code)):
        got = judge(ranks, expected)
        if got is not None:
            return verdict(got[0], rule, got[1])
    if silent:
        lost = sorted(r for n in silent for r in expected_nodes.get(n, ()))
        return verdict(lost, "node_silent", f"no summary from node(s) {_list(silent)}")
    if (got := _progress(ranks)) is not None:
        return verdict(got[0], "progress", got[1])
    return verdict((), "undetermined", "the ranks could not be told apart")


def _one_per_node(summaries: Iterable[NodeSummary]) -> dict[int, NodeSummary]:
    """By node rank, in order; of two summaries from one node the one that sorts first."""
    chosen: dict[int, NodeSummary] = {}
    for s in summaries:
        old = chosen.get(s.node_rank)
        if old is None or repr(s) < repr(old):
            chosen[s.node_rank] = s
    return dict(sorted(chosen.items()))


def _waits(r: RankState) -> bool:
    return any(g.waiting for g in r.groups or ()) or r.where in WAITS


Found = tuple[list[int], str] | None


# ---- 1. desync ----


def _desync(ranks: Mapping[int, RankState]) -> tuple[list[int], Mismatch | None, str] | None:
    calls: dict[tuple[str, int], dict[int, Call]] = {}
    for r in sorted(ranks):
        for g in ranks[r].groups or ():
            for c in (g.completed, g.started, g.enqueued):  # the latest word on a seq last
                if c is not None and c.op is not None:
                    calls.setdefault((g.name, c.seq), {})[r] = c
    saw = {r: s.witness for r, s in ranks.items() if s.witness is not None and says_mismatch(s.witness)}
    for (group, seq), by_rank in sorted(calls.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        kinds = {r: _kind(c) for r, c in by_rank.items()}
        if len(set(kinds.values())) < 2:
            continue
        votes = Counter(kinds.values())
        # a rank whose receive caught the mismatch (and left no call of its own here) held
        # the smaller buffer of it: its vote goes to the smallest call (gloo's size check)
        sizes = {k: _elements(k) for k in votes}
        if len({k[0] for k in votes}) == 1 and None not in sizes.values():
            smallest = min(votes, key=lambda k: (sizes[k], repr(k)))
            votes[smallest] += sum(1 for r, line in saw.items() if r not in by_rank and _held_smaller(line))
        top = max(votes.values())
        common = [k for k, n in votes.items() if n == top]
        # no majority: every rank of the tied calls is named, none favoured by its number
        odd = sorted(r for r, k in kinds.items() if k not in common or len(common) > 1)
        m = Mismatch(group, seq, tuple((r, c.op, _shape(c), c.at) for r, c in sorted(by_rank.items())))
        if len(common) > 1:
            said = "; ".join(f"rank {r} called {c.op} {_shape(c)}{_site(c)}" for r, c in by_rank.items())
            return odd, m, f"group {group} collective #{seq}, no majority: {said}"
        want = by_rank[min(r for r, k in kinds.items() if k == common[0])]
        got = by_rank[odd[0]]
        detail = (
            f"group {group} collective #{seq}: rank(s) {_list(odd)} called {got.op} {_shape(got)}"
            f"{_site(got)} where rank(s) {_list(r for r in kinds if r not in odd)} called "
            f"{want.op} {_shape(want)}{_site(want)}"
        )
        if any(r not in by_rank for r in saw):
            detail += f"; rank(s) {_list(r for r in saw if r not in by_rank)} caught the mismatch"
        return odd, m, detail
    return _witnessed(ranks, saw)


def _witnessed(ranks: Mapping[int, RankState], saw: Mapping[int, str]) -> tuple[list[int], None, str] | None:
    """A rank caught a mismatch; the calls the dumps show agree (the ranks that could tell
    exited first). Two or more agreeing at the front show the common call: the culprit is a
    rank whose call there is unknown, never the catcher (it received the odd data), or the
    catcher when every other call is known. With one call known (maybe the odd one): the
    dumped ranks that blamed no peer, else every dumped one (a reset hits the culprit too)."""
    if not saw:
        return None
    fronts = {r: g.enqueued.seq for r, st in ranks.items() for g in st.groups or ()
              if g.name == DEFAULT_GROUP and g.enqueued is not None}  # fmt: skip
    known = sorted(r for r, seq in fronts.items() if seq == max(fronts.values()))
    dumped = [r for r in sorted(ranks) if ranks[r].groups is not None and r not in saw]
    if len(known) >= 2:
        unknown = sorted(r for r in ranks if r not in known and r not in saw)
        named, why = unknown or sorted(saw), f"rank(s) {_list(known)} agree at the front"
    else:
        named, why = [r for r in dumped if ranks[r].witness is None] or dumped, "one call known"
    if not named:
        return None
    where = "; ".join(f"rank {r}: {_front(ranks[r])}" for r in named)
    return named, None, f"rank(s) {_list(saw)} caught a mismatch ({saw[min(saw)]}); {why}: {where}"


_GLOO_SIZE = re.compile(r"(\d+) vs (\d+)\. Received data size", re.IGNORECASE)  # got 8 bytes, wanted 4


def _held_smaller(line: str) -> bool:
    m = _GLOO_SIZE.search(line)
    return m is not None and int(m.group(1)) > int(m.group(2))


def _elements(kind: tuple[str | None, str]) -> int | None:
    """How many elements a call's inputs hold, from its shape text ("[8, 2x3]"); None: not known."""
    text = kind[1].strip("[]")
    if not text or "?" in text:
        return None
    total = 0
    for shape in text.split(", "):
        n = 1
        for d in shape.split("x"):
            n *= int(d) if d.isdigit() else 1
        total += n
    return total


def _front(r: RankState) -> str:
    """Its latest call in the default group, or where it stands."""
    for g in r.groups or ():
        if g.name == DEFAULT_GROUP and g.enqueued is not None:
            c = g.enqueued
            return f"{c.op or 'a collective'} {_shape(c)}{_site(c)} (#{c.seq})"
    return _place(r)


def _kind(c: Call) -> tuple[str | None, str]:
    return (c.op, _shape(c) if c.op in SIZED else "")


def _shape(c: Call) -> str:
    return "?" if c.sizes is None else "[" + ", ".join("x".join(map(str, s)) or "()" for s in c.sizes) + "]"


def _site(c: Call) -> str:
    return f" at {c.at}" if c.at else ""


# ---- 2. wavefront ----


def _wavefront(ranks: Mapping[int, RankState], expected: Sequence[int]) -> Found:
    seqs: dict[str, dict[int, int]] = {}
    for r, state in ranks.items():
        for g in state.groups or ():
            seqs.setdefault(g.name, {})[r] = g.enqueued.seq if g.enqueued is not None else 0
    behind: dict[int, list[str]] = {}
    said = []
    for group, by_rank in sorted(seqs.items()):
        top = max(by_rank.values())
        late = sorted(r for r, n in by_rank.items() if n < top)
        for r in late:
            behind.setdefault(r, []).append(group)
        if late:
            said.append(
                f"group {group}: rank(s) {_list(late)} at collective #{min(by_rank[r] for r in late)}, "
                f"others at #{top}"
            )
    # one behind that waits at the front of another group waits for someone else: follow
    # on. Its own wait in a group where it is behind does not count: the others finished
    # that collective, so it took part (gloo marks a collective completed late, after the
    # rank has moved on)
    roots = sorted(
        r for r in behind if not any(g.waiting and g.name not in behind[r] for g in ranks[r].groups or ())
    )
    if not roots:
        return None
    where = "; ".join(f"rank {r}: {_place(ranks[r])}" for r in roots)
    return roots, "; ".join(said) + f": the others wait for it ({where})"


# ---- 3. absent ----


def _absent(ranks: Mapping[int, RankState], expected: Sequence[int]) -> Found:
    dumped = {r: s for r, s in ranks.items() if s.groups is not None}
    if not dumped or not all(any(g.waiting for g in s.groups or ()) for s in dumped.values()):
        return None  # someone answered and waits for nobody: not this rule
    tops = [
        g.enqueued.seq
        for s in dumped.values()
        for g in s.groups or ()
        if g.name == DEFAULT_GROUP and g.waiting and g.enqueued is not None
    ]
    missing = [r for r in expected if r not in dumped and (r not in ranks or ranks[r].where != "ended")]
    # of those, the ones whose stacks do not show them waiting too (a node without dumps)
    missing = [r for r in missing if r not in ranks or ranks[r].where not in INNOCENT] or missing
    if not tops or not missing:
        return None
    why = "; ".join(f"rank {r}: {_place(ranks[r]) if r in ranks else 'no summary'}" for r in missing)
    return missing, (
        f"rank(s) {_list(dumped)} wait in a collective (the default group's #{max(tops)}); "
        f"no dump from rank(s) {_list(missing)} ({why})"
    )


# ---- 4. own code ----


def _own_code(ranks: Mapping[int, RankState], expected: Sequence[int]) -> Found:
    seen = {r: s.where for r, s in ranks.items() if s.where != "unknown"}
    if len(seen) < 2:
        return None
    low = min(seen.values(), key=PLACES.index)
    stuck = sorted(r for r, w in seen.items() if w == low)
    # a rank that exited after the incident began gave up waiting (or was ended) because of it
    if low in INNOCENT or not any(w in INNOCENT for w in seen.values()):
        return None  # nobody stands apart, or nobody waits for anyone
    others = sorted(r for r, w in seen.items() if w in INNOCENT)
    where = "; ".join(f"rank {r}: {_place(ranks[r])}" for r in stuck)
    return stuck, f"{where}; rank(s) {_list(others)} wait for their peers"


# ---- 6. progress ----


def _progress(ranks: Mapping[int, RankState]) -> Found:
    known = {r: s.iteration for r, s in ranks.items() if s.iteration is not None}
    values = {v for v in known.values() if v is not None}
    if len(values) < 2:
        return None
    low, high = min(values), max(values)
    late = sorted(r for r, v in known.items() if v == low)
    return late, f"rank(s) {_list(late)} at iteration {low}, others up to {high}"


def _place(r: RankState) -> str:
    return r.where + (f" ({r.why})" if r.why else "")


def _list(ranks: Iterable[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


# ---- the wire form ----


def to_json(b: JobBlame) -> dict[str, Any]:
    m = b.mismatch
    return {
        "ranks": list(b.ranks),
        "nodes": list(b.nodes),
        "rule": b.rule,
        "detail": b.detail,
        "silent": list(b.silent),
        "waiting": list(b.waiting),
        "truncated": list(b.truncated),
        "mismatch": None
        if m is None
        else {
            "group": m.group,
            "seq": m.seq,
            "calls": [{"rank": r, "op": op, "sizes": sizes, "at": at} for r, op, sizes, at in m.calls],
        },
    }
