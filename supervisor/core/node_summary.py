"""One node's account of a hang, compact enough to hand to every other node of the job.

When a hang is declared anywhere in a job, each node gathers what it has about its
own ranks (their Flight Recorder dumps, their Python stacks, their progress) and
publishes one ``NodeSummary`` per incident; ``supervisor.core.job_blame`` then
reads every node's summary and names the culprit the same way on every node.

The API, for the runtime that gathers and exchanges it::

    evidence = [RankEvidence(rank=3, dump=raw_dump_or_None, reading=stacks.read(text),
                             iteration=41, gone=False), ...]
    summary = summarize_node(node_rank=1, node="host-b", incident="g0:step:3", generation=0,
                             ranks=evidence)
    payload: bytes = encode(summary)      # canonical JSON, at most LIMIT bytes
    again = decode(payload)               # a peer's payload: None when unusable, never raises

Per rank and process group a summary keeps the last collective enqueued, started and
completed (sequence number, op, input sizes, the user's call site), and where the
rank stands: ``own`` code, ``compute`` (backward), waiting in a ``collective`` (by its
stacks, or by its own word: it said it timed out waiting in one), ``stopped``, ``gone``
(exited before the incident began), ``ended`` (exited after it began: because of it, a
peer's node stopping its ranks, or its work resumed and done), ``unknown`` (no stacks).
A rank whose line blames a peer for its collective (gloo's size check, a reset by the
peer) is a witness: it stands in its ``collective``, and its line is kept (``witness``:
what it says the peer did; older nodes ignore the key).
Stacks read while the rank lived say more than its exit since. Sequence numbers are those
of the dump's ``pg_status``; op and sizes come from its ring of entries when the
entry is still there.

What torch 2.13 records on gloo (docs/guides/hangs.md): every entry stays
``scheduled`` and ``last_started_collective`` stays -1, but ``last_completed_collective``
moves (late at times: after the rank has moved on); so "waiting" is read as enqueued >
completed, never from the entry's state.

Bounded: ``encode`` yields at most ``LIMIT`` (64 KiB). Texts and size lists are cut
when the summary is built; if it is still too big, call sites go first, then the
ranks with the highest numbers, and ``truncated`` says what went (deterministic:
the same summary always loses the same parts).

Pure: values in, values out; the runtime reads the dump file (``supervisor.process.native``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from supervisor.core.flight import FRAMEWORK
from supervisor.core.stacks import Reading, Where

VERSION = 1
LIMIT = 64 * 1024  # bytes of JSON per node per incident
TEXT = 160  # characters kept of any text (a call site, a stack's reason)
SIZES = 8  # tensors kept of a collective's input sizes, and dimensions of each
GROUPS = 32  # process groups kept per rank (the ones with the highest names go)

WHERE = {Where.STOPPED: "stopped", Where.OWN: "own", Where.COMPUTE: "compute", Where.COLLECTIVE: "collective"}
# the most suspect first: a rank that exited after the incident began did so because of it
# (older nodes read "ended" as "unknown": the least suspect either way)
PLACES = ("gone", "stopped", "own", "compute", "collective", "ended", "unknown")


@dataclass(frozen=True, slots=True)
class Call:
    """One collective of a process group, as a rank recorded it."""

    seq: int
    op: str | None = None  # without the backend's prefix: all_reduce, all_gather, ...
    sizes: tuple[tuple[int, ...], ...] | None = None  # its input tensors' shapes
    at: str | None = None  # the user's innermost frame that issued it


@dataclass(frozen=True, slots=True)
class Group:
    """One process group on one rank: how far it got."""

    name: str  # the group's name in the dump ("0": the default group)
    desc: str | None
    enqueued: Call | None
    started: Call | None  # None on gloo (never recorded) and while nothing started
    completed: Call | None

    @property
    def waiting(self) -> bool:
        """Issued a collective that has not completed: waits for its peers."""
        return self.enqueued is not None and (
            self.completed is None or self.completed.seq < self.enqueued.seq
        )


@dataclass(frozen=True, slots=True)
class RankState:
    rank: int
    where: str  # one of PLACES
    why: str | None = None  # the frame that decided where, or why nothing is known
    iteration: int | None = None
    groups: tuple[Group, ...] | None = None  # None: no Flight Recorder dump
    dump_error: str | None = None
    witness: str | None = None  # its line blaming a peer (a size mismatch, a reset): what the peer did


@dataclass(frozen=True, slots=True)
class NodeSummary:
    node_rank: int
    node: str
    incident: str
    generation: int
    ranks: tuple[RankState, ...]
    truncated: str | None = None  # what the bound cut, if anything
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class RankEvidence:
    """What the node has about one of its ranks when it summarises (the builder's input)."""

    rank: int
    dump: Any = None  # the raw Flight Recorder dump (a dict), as read
    dump_error: str | None = None
    reading: Reading | None = None  # its stacks, read (``core.stacks.read``)
    iteration: int | None = None
    gone: bool = False  # the process has exited
    after: bool = False  # ...after the incident began (its exit is the incident's doing)
    waited: str | None = None  # its line saying it timed out waiting in a collective
    witness: str | None = None  # its line blaming a peer for its collective (a mismatch, a reset)


def summarize_node(
    node_rank: int, node: str, incident: str, generation: int, ranks: Sequence[RankEvidence]
) -> NodeSummary:
    """The node's summary, ranks in order; cut to the bound when encoded."""
    states = tuple(_rank(e) for e in sorted(ranks, key=lambda e: e.rank))
    return NodeSummary(node_rank, _text(node) or "", _text(incident) or "", generation, states)


def _rank(e: RankEvidence) -> RankState:
    groups = groups_of(e.dump) if e.dump is not None else None
    if e.waited is not None:
        where, why = "collective", f"timed out waiting: {e.waited.strip()}"
    elif e.witness is not None:  # a peer broke the collective it was in: a witness, whatever came after
        where, why = "collective", "blames a peer (witness)"
    elif e.reading is not None:  # read while it lived: where it stood, whatever came after
        where, why = WHERE[e.reading.where], e.reading.why
    elif e.gone:
        where = "ended" if e.after else "gone"
        why = "exited after the incident began" if e.after else "the process has exited"
    else:
        where, why = "unknown", "no stacks"
    witness = None if e.witness is None else _text(_SOURCE.sub("", e.witness).strip())
    return RankState(e.rank, where, _text(why), e.iteration, groups, _text(e.dump_error), witness)


# gloo's source location ("[enforce fail at .../pair.cc:456] "), cut from a witness's line so
# that what it says the peer did fits the text bound
_SOURCE = re.compile(r"\[(?:enforce fail at )?[^\]\s]*\.(?:cc|cpp|h):\d+\]\s*")


def groups_of(dump: Any) -> tuple[Group, ...] | None:
    """Each process group of a raw dump: the last collective enqueued, started, completed."""
    if not isinstance(dump, Mapping) or not isinstance(dump.get("pg_status"), Mapping):
        return None
    entries = dump["entries"] if isinstance(dump.get("entries"), list) else []
    by_seq: dict[tuple[str, int], Mapping[str, Any]] = {}
    descs: dict[str, str] = {}
    for e in entries:
        if not isinstance(e, Mapping) or e.get("is_p2p"):
            continue
        pg, seq = e.get("process_group"), _int(e.get("collective_seq_id"))
        if isinstance(pg, Sequence) and not isinstance(pg, str) and len(pg) >= 1 and seq is not None:
            by_seq[(str(pg[0]), seq)] = e
            if len(pg) >= 2 and isinstance(pg[1], str):
                descs[str(pg[0])] = pg[1]
    out = []
    for key, st in sorted(dump["pg_status"].items(), key=lambda kv: str(kv[0])):
        if not isinstance(st, Mapping):
            continue
        name = str(key)

        def call(key: str, name: str = name, st: Mapping[str, Any] = st) -> Call | None:
            seq = _int(st.get(key))
            return None if seq is None or seq <= 0 else _call(seq, by_seq.get((name, seq)))

        out.append(
            Group(
                _text(name) or "",
                _text(descs.get(name)),
                call("last_enqueued_collective"),
                call("last_started_collective"),
                call("last_completed_collective"),
            )
        )
    return tuple(out[:GROUPS])


def _call(seq: int, entry: Mapping[str, Any] | None) -> Call:
    if entry is None:
        return Call(seq)  # the ring no longer holds it
    op = entry.get("profiling_name")
    op = op.split(":", 1)[-1] if isinstance(op, str) else None
    return Call(seq, _text(op), _sizes(entry.get("input_sizes")), _text(_site(entry.get("frames"))))


def _sizes(value: Any) -> tuple[tuple[int, ...], ...] | None:
    if not isinstance(value, list):
        return None
    shapes = []
    for shape in value[:SIZES]:
        if not isinstance(shape, list) or not all(_int(d) is not None for d in shape):
            return None
        shapes.append(tuple(shape[:SIZES]))
    return tuple(shapes)


def _site(frames: Any) -> str | None:
    if not isinstance(frames, Sequence):
        return None
    for f in frames:
        name = f.get("filename") if isinstance(f, Mapping) else None
        if isinstance(name, str) and not any(part in name for part in FRAMEWORK):
            return f"{name}:{f.get('line')} {f.get('name')}"
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return value if len(value) <= TEXT else value[: TEXT - 1] + "…"


# ---- the wire form: canonical JSON, bounded ----


def to_json(s: NodeSummary) -> dict[str, Any]:
    return {
        "version": s.version,
        "node_rank": s.node_rank,
        "node": s.node,
        "incident": s.incident,
        "generation": s.generation,
        "truncated": s.truncated,
        "ranks": [
            {
                "rank": r.rank,
                "where": r.where,
                "why": r.why,
                "iteration": r.iteration,
                "dump_error": r.dump_error,
                "witness": r.witness,
                "groups": None if r.groups is None else [_group_json(g) for g in r.groups],
            }
            for r in s.ranks
        ],
    }


def _group_json(g: Group) -> dict[str, Any]:
    return {
        "name": g.name,
        "desc": g.desc,
        "enqueued": _call_json(g.enqueued),
        "started": _call_json(g.started),
        "completed": _call_json(g.completed),
    }


def _call_json(c: Call | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {
        "seq": c.seq,
        "op": c.op,
        "at": c.at,
        "sizes": None if c.sizes is None else [list(s) for s in c.sizes],
    }


def _dumps(s: NodeSummary) -> bytes:
    return json.dumps(to_json(s), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def encode(s: NodeSummary, limit: int = LIMIT) -> bytes:
    """Canonical JSON of the summary, at most ``limit`` bytes: cut as the module says."""
    data = _dumps(s)
    if len(data) <= limit:
        return data
    bare = replace(s, ranks=tuple(_no_sites(r) for r in s.ranks))

    def cut(kept: int) -> bytes:
        dropped = [r.rank for r in s.ranks[kept:]]
        note = "call sites dropped"
        if dropped:
            note += f"; ranks {dropped[0]}-{dropped[-1]} dropped ({len(dropped)})"
        return _dumps(replace(bare, ranks=bare.ranks[:kept], truncated=note))

    # the most ranks, lowest first, that fit: a search, not a dump per rank dropped
    best, low, high = cut(len(bare.ranks)), 0, len(bare.ranks) - 1
    if len(best) <= limit:
        return best
    best = cut(0)
    while low <= high:
        middle = (low + high) // 2
        data = cut(middle)
        if len(data) <= limit:
            best, low = data, middle + 1
        else:
            high = middle - 1
    return best


def _no_sites(r: RankState) -> RankState:
    if r.groups is None:
        return r
    strip = [
        replace(
            g,
            **{
                k: replace(c, at=None)
                for k in ("enqueued", "started", "completed")
                if (c := getattr(g, k)) is not None
            },
        )
        for g in r.groups
    ]
    return replace(r, groups=tuple(strip))


def decode(payload: bytes | str) -> NodeSummary | None:
    """A peer's summary; None when it is not one (a wrong version, not JSON, no node)."""
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    return from_json(data)


def from_json(data: Any) -> NodeSummary | None:
    """The summary in ``data``; a malformed rank or group is skipped, never raised."""
    if not isinstance(data, Mapping) or data.get("version") != VERSION:
        return None
    node_rank, generation = _int(data.get("node_rank")), _int(data.get("generation"))
    if node_rank is None or generation is None:
        return None
    ranks = data["ranks"] if isinstance(data.get("ranks"), list) else []
    states = tuple(r for r in (_rank_from(x) for x in ranks) if r is not None)
    return NodeSummary(
        node_rank,
        _text(data.get("node")) or "",
        _text(data.get("incident")) or "",
        generation,
        tuple(sorted(states, key=lambda r: r.rank)),
        _text(data.get("truncated")),
    )


def _rank_from(x: Any) -> RankState | None:
    if not isinstance(x, Mapping) or (rank := _int(x.get("rank"))) is None:
        return None
    where = x.get("where") if x.get("where") in PLACES else "unknown"
    groups = x.get("groups")
    parsed = (
        None if not isinstance(groups, list) else tuple(g for g in map(_group_from, groups) if g is not None)
    )
    return RankState(
        rank, str(where), _text(x.get("why")), _int(x.get("iteration")), parsed, _text(x.get("dump_error")),
        _text(x.get("witness")),
    )  # fmt: skip


def _group_from(x: Any) -> Group | None:
    if not isinstance(x, Mapping) or not isinstance(x.get("name"), str):
        return None
    return Group(
        x["name"],
        _text(x.get("desc")),
        _call_from(x.get("enqueued")),
        _call_from(x.get("started")),
        _call_from(x.get("completed")),
    )


def _call_from(x: Any) -> Call | None:
    if not isinstance(x, Mapping) or (seq := _int(x.get("seq"))) is None:
        return None
    sizes = x.get("sizes")
    shapes = None
    if isinstance(sizes, list) and all(
        isinstance(s, list) and all(_int(d) is not None for d in s) for s in sizes
    ):
        shapes = tuple(tuple(s) for s in sizes)
    op = x.get("op")
    return Call(seq, _text(op), shapes, _text(x.get("at")))
