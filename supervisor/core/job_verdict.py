"""What a node does with the job's blame of a hang (``core.job_blame``): the same on every node.

Every node of the job holds the same verdict; each applies it to itself:

* ``culprits_here``: the job's culprit ranks that run on this node: only they are named
  hung here (their node's ledger is marked, and on repeats the node is sent away);
* ``followed``: a node whose ranks only waited follows the job as it would a peer's
  news (``peer_failed``), with the culprit rank and node in its words, never
  ``rank_hung`` against its own ranks;
* ``desync_decision``: ranks that called different collectives (or sizes) at the same
  point are a program error no restart fixes: abort on the first occurrence, the
  mismatch named (op, sizes, ranks, call sites);
* ``reason_fields``: ``job_blame`` in reason.json, on every node alike.

An undetermined verdict names nobody: each node then keeps its own blame.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from supervisor.core.job_blame import JobBlame
from supervisor.core.types import Action, Decision, Reason

DETAIL_MAX = 600  # characters of the verdict's detail kept in a decision


def expected_nodes(nnodes: int, nproc_per_node: int) -> dict[int, list[int]]:
    """Each node rank's global ranks, as torchrun places them (node-major, the same count on
    each): what this node assumes of the others. ``job_blame`` places every rank a node reported
    on that node, whatever its count; this layout only places the ranks nobody reported."""
    return {n: list(range(n * nproc_per_node, (n + 1) * nproc_per_node)) for n in range(nnodes)}


def culprits_here(verdict: JobBlame, ranks_here: Iterable[int]) -> tuple[int, ...]:
    here = set(ranks_here)
    return tuple(r for r in verdict.ranks if r in here)


def named(verdict: JobBlame, hosts: Mapping[int, str] | None = None) -> str:
    """ "rank(s) 3 on node(s) 1 (host-b)": who the job blames, for people."""
    hosts = hosts or {}
    ranks = ", ".join(map(str, verdict.ranks)) or "none"
    nodes = ", ".join(f"{n} ({hosts[n]})" if hosts.get(n) else str(n) for n in verdict.nodes) or "none"
    return f"rank(s) {ranks} on node(s) {nodes}"


def followed(verdict: JobBlame, hosts: Mapping[int, str] | None = None) -> str:
    """The words of a node whose ranks were not the culprits: the news it follows."""
    return f"job blame ({verdict.rule}): {named(verdict, hosts)}: {verdict.detail}"[:DETAIL_MAX]


def desync_decision(fields: Mapping[str, Any]) -> Decision | None:
    """A desync aborts the job on its first occurrence, the mismatch named
    (``fields``: ``reason_fields`` of the verdict)."""
    if fields.get("rule") != "desync":
        return None
    return Decision(
        Action.ABORT,
        Reason.NOT_RETRYABLE,
        f"collective desync, a program error no restart fixes: {fields.get('detail')}"[:DETAIL_MAX],
    )


def reason_fields(verdict: JobBlame) -> dict[str, Any]:
    """``job_blame`` in reason.json: {rule, ranks, nodes, detail, mismatch?}."""
    out: dict[str, Any] = {
        "rule": verdict.rule,
        "ranks": list(verdict.ranks),
        "nodes": list(verdict.nodes),
        "detail": verdict.detail,
        "silent": list(verdict.silent),
    }
    m = verdict.mismatch
    if m is not None:
        out["mismatch"] = {
            "group": m.group,
            "seq": m.seq,
            "calls": [{"rank": r, "op": op, "sizes": sizes, "at": at} for r, op, sizes, at in m.calls],
        }
    return out
