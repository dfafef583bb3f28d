"""One verdict for a job from every node's run directory (``classify RUN_DIR RUN_DIR...``).

Each node's daemon judged its own ranks; the job's root is one rank on one node,
whatever order the directories are given in:

* where the run directories' reason.json carry ``job_blame`` (the blame the nodes
  agreed on at a job-wide hang: {rule, ranks, nodes, detail, mismatch?}), that is
  the verdict, and every node that carries one must say the same (rule, ranks,
  nodes, mismatch): where they differ, each is listed;
* where none does (older runs, or no job-wide incident), each node's first
  failure judged on its own evidence (the replay's earliest own judgement: its
  root rank and when that rank failed, wall clock) decides: a rank's own failure
  before a waiting rank's timeout before a peer's reset (``root_tier``, as on one
  node), then the earliest, then the lowest node rank.

``node_runs`` reads what the pure ``job_verdict`` needs from the replayed runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from supervisor.core.classify import Classification, root_tier
from supervisor.postmortem.replay import Judged, ReplayedRun
from supervisor.postmortem.runlog import read_run

_SAME = ("rule", "ranks", "nodes", "mismatch")  # what nodes carrying job_blame must agree on


@dataclass(frozen=True, slots=True)
class NodeRun:
    """What one node's run directory says of the job's failure."""

    run_dir: str
    node: str  # its node rank where the run was one of several nodes, else its host
    node_rank: int | None
    run_id: str | None
    job_blame: dict[str, Any] | None
    generation: int | None = None  # of its first own failure
    rule: str | None = None
    rank: int | None = None
    tier: int = 0  # root_tier of that failure
    t_wall: float | None = None  # when its root rank failed


@dataclass(frozen=True, slots=True)
class JobVerdict:
    source: str  # job_blame | first_failure | none
    rule: str | None
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    detail: str
    agree: bool  # the nodes that carry job_blame say the same
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source, "rule": self.rule, "ranks": list(self.ranks), "nodes": list(self.nodes),
            "detail": self.detail, "agree": self.agree, "notes": list(self.notes),
        }  # fmt: skip


def _first_own(replayed: ReplayedRun) -> tuple[Judged, Classification] | None:
    """The earliest generation this node judged a failure of its own ranks in."""
    for j in sorted(replayed.judged, key=lambda j: j.generation):
        c = j.classification
        if j.own and c is not None and c.rule != "none":
            return j, c
    return None


def _failed_at(j: Judged, c: Classification) -> float | None:
    failures = () if j.evidence is None else j.evidence.failures
    at = [f.exit.at_wall for f in failures if f.exit.rank == c.rank and f.exit.at_wall]
    at = at or [f.exit.at_wall for f in failures if f.exit.at_wall]
    if at:
        return min(at)
    t = j.event.get("t_wall")
    return float(t) if isinstance(t, int | float) else None


def _reason(run_dir: Path) -> dict[str, Any]:
    try:
        content = orjson.loads((run_dir / "reason.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return content if isinstance(content, dict) else {}


def node_runs(replayed: Sequence[ReplayedRun]) -> list[NodeRun]:
    out = []
    for r in replayed:
        reason = _reason(r.run_dir)
        ranks = [
            g.node_rank for _, g in sorted(read_run(r.run_dir).generations.items()) if g.node_rank is not None
        ]
        node_rank = ranks[0] if ranks else None
        host = str(reason.get("node") or r.run_dir.name)
        blame = reason.get("job_blame")
        base = NodeRun(
            str(r.run_dir), f"node {node_rank}" if node_rank is not None else host, node_rank,
            reason.get("run_id"), blame if isinstance(blame, dict) else None,
        )  # fmt: skip
        first = _first_own(r)
        if first is not None:
            j, c = first
            base = NodeRun(base.run_dir, base.node, node_rank, base.run_id, base.job_blame, j.generation,
                           c.rule, c.rank, root_tier(c), _failed_at(j, c))  # fmt: skip
        out.append(base)
    return out


def _order(n: NodeRun) -> tuple[Any, ...]:
    return (n.node_rank is None, n.node_rank or 0, n.node, n.run_dir)


def _said(blame: dict[str, Any]) -> str:
    return f"{blame.get('rule')}: ranks {blame.get('ranks')} on nodes {blame.get('nodes')}"


def job_verdict(nodes: Sequence[NodeRun]) -> JobVerdict:
    """The job's root rank and node from every node's run (any order: the same answer)."""
    ordered = sorted(nodes, key=_order)
    notes = []
    ids = sorted({n.run_id for n in ordered if n.run_id})
    if len(ids) > 1:
        notes.append(f"not one job: run ids {', '.join(ids)}")
    carriers = [n for n in ordered if n.job_blame is not None]
    if carriers:
        said = {n.node: {k: n.job_blame.get(k) for k in _SAME} for n in carriers if n.job_blame is not None}
        first = carriers[0].job_blame or {}
        agree = all(s == said[carriers[0].node] for s in said.values())
        if not agree:
            notes += [f"{node} says {_said(s)}" for node, s in said.items()]
        notes += [
            f"{n.node} ({n.run_dir}): no job_blame in its reason.json" for n in ordered if n not in carriers
        ]
        named = tuple(str(x) for x in first.get("nodes") or ())
        ranks = tuple(first.get("ranks") or ())
        return JobVerdict("job_blame", first.get("rule"), ranks, named, str(first.get("detail") or ""), agree,
                          tuple(notes))  # fmt: skip
    failed = [n for n in ordered if n.rule is not None]
    if not failed:
        return JobVerdict(
            "none", None, (), (), "no node judged a failure of its own ranks", True, tuple(notes)
        )
    root = min(failed, key=lambda n: (n.tier, n.t_wall if n.t_wall is not None else float("inf"), _order(n)))
    how = ("no reason.json carries job_blame: the earliest first failure across the nodes (t_wall), a rank's "
           "own failure before a waiting rank's timeout before a peer's reset")  # fmt: skip
    notes += [
        f"{n.node}: generation {n.generation} {n.rule}, rank {n.rank}, at t_wall {n.t_wall}" for n in failed
    ]
    own = () if root.rank is None else (root.rank,)
    return JobVerdict("first_failure", root.rule, own, (root.node,), how, True, tuple(notes))


def render(v: JobVerdict) -> str:
    ranks = ", ".join(map(str, v.ranks)) or "-"
    out = [f"job:      {v.rule or '-'}: rank {ranks} on {', '.join(v.nodes) or '-'} (from {v.source})",
           f"          {v.detail}" if v.detail else "",
           "" if v.agree else "          the nodes' job_blame disagree:"]  # fmt: skip
    out += [f"  {note}" for note in v.notes]
    return "\n".join(line for line in out if line)
