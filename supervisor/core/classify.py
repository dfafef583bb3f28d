"""Classification: what a failure was, by the first rule that explains it.

Per failed rank, its text (error file, reported exception, lines noticed while
it ran, its log's tail) is matched against the rules in order; the first rule
that matches and is not a wrapper wins, so a ``DistBackendError`` or an NCCL
watchdog message is explained by the cause it wraps, and the wrapper itself
classifies only when no cause is recognised (the most severe of them, if several).
Exit codes, signals and hangs are
rules too (placed after the text rules). Across ranks the earliest failure is
the root cause, unless it is a symptom of a peer's: a rank that failed on its
own (died of a signal, raised) comes before one that waited for a peer and timed
out (``blame = "waiting"``: a collective's watchdog), and that before one whose
rule blames a peer (``ncclRemoteError``, a reset connection), whatever the order
they were reported in. Where the root blames a peer, the peer its line names
(an address, a rank) is kept in ``blames``. Kernel log
lines (Xid...) are node-level evidence: when one implies a more severe action
than the root cause's (an illegal memory access next to Xid 48), it wins.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from supervisor.core.agentlog import first_failure, launcher_ranks
from supervisor.core.evidence import Evidence
from supervisor.core.patterns import Screen, encodable
from supervisor.core.rules import Hit, Rule, match_lines, strip_prefix
from supervisor.core.types import SEVERITY, Action, RankFailure

UNCLASSIFIED = "unclassified"
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")


@dataclass(frozen=True, slots=True)
class Classification:
    """What a failure was: the rule that explained it and what that rule implies."""

    rule: str
    category: str
    nature: str  # transient | hardware | deterministic | not_failure
    action: Action  # on a first occurrence
    repeat: Action | None = None  # once the rule matched ``after`` times before on this node
    after: int = 1
    rank: int | None = None
    lines: tuple[str, ...] = ()  # the evidence lines that matched
    wrapped_by: tuple[str, ...] = ()  # wrapper rules the cause was found inside
    peer: bool = False  # the rule blames a peer: not this rank's own failure
    waiting: bool = False  # a waiting rank's symptom (a watchdog timeout): yields to a rank's own failure
    blames: str = ""  # the peer a peer-blaming line names (an address, a rank), where it does
    source: str = ""  # the plugin that classified it
    summary: str = ""

    @property
    def signature(self) -> str:
        """The same failure again: the rule and its first line with numbers blanked."""
        first = self.lines[0] if self.lines else ""
        return f"{self.rule}|{_NUMBERS.sub('#', first)[:200]}"

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "category": self.category,
            "nature": self.nature,
            "action": str(self.action),
            "rank": self.rank,
            "lines": list(self.lines),
            "wrapped_by": list(self.wrapped_by),
            "peer": self.peer,
            "blames": self.blames or None,
            "source": self.source,
            "summary": self.summary,
        }


def unclassified(rank: int | None = None, lines: tuple[str, ...] = ()) -> Classification:
    return Classification(
        UNCLASSIFIED, "unknown", "transient", Action.RESTART, rank=rank, lines=lines,
        summary="no rule explains this failure",
    )  # fmt: skip


def _from_hit(hit: Hit, rank: int | None, wrapped_by: tuple[str, ...]) -> Classification:
    r = hit.rule
    return Classification(
        rule=r.id,
        category=r.category,
        nature=r.nature,
        action=hit.action,
        repeat=r.repeat,
        after=r.after,
        rank=rank,
        lines=tuple(dict.fromkeys(hit.lines)),
        wrapped_by=wrapped_by,
        peer=r.blame_peer,
        waiting=r.waiting,
        blames=hit.groups.get("peer", "") if r.blame_peer else "",
        summary=r.summary,
    )


def _status_hit(rule: Rule, failure: RankFailure) -> Hit | None:
    if failure.exit.terminated:
        return None  # the signal was ours (the termination procedure): it says nothing of the cause
    status = failure.exit.status
    if (status.code is not None and status.code in rule.exit_codes) or (
        status.signal is not None and status.signal in rule.signals
    ):
        return Hit(rule, (f"ended with {status.describe()}",), {}, 0)
    return None


def _rule_hit(
    rule: Rule, lines: Sequence[str], failure: RankFailure | None, where: Mapping[str, Sequence[int]]
) -> Hit | None:
    if rule.before_first_step and (failure is None or failure.progressed is not False):
        return None
    if rule.hang:
        if failure is None or failure.hang is None:
            return None
        return Hit(rule, (f"hung: {failure.hang.describe()}",), {}, 0)
    hit = match_lines(rule, lines, where=where) if rule.patterns else None
    if rule.exit_codes or rule.signals:
        status = _status_hit(rule, failure) if failure is not None else None
        if status is None or (rule.patterns and hit is None):
            return None
        return hit or status
    return hit


def classify_lines(
    rules: Sequence[Rule],
    lines: Sequence[str],
    *,
    failure: RankFailure | None = None,
    scopes: tuple[str, ...] = ("rank",),
) -> Classification | None:
    """The first non-wrapper rule that matches, else the first wrapper; None if none."""
    text = [encodable(strip_prefix(ln)) for ln in lines]
    # every pattern against each line in one pass; a rule then searches only the
    # lines its patterns matched (for the groups), not every line
    where = Screen(p for r in rules for p in r.patterns).index(text)
    rank = failure.exit.rank if failure is not None else None
    hits = [h for r in rules if _in(r, scopes) and (h := _rule_hit(r, text, failure, where)) is not None]
    if failure is not None and (_killed_from_outside(failure) or failure.hang is not None):
        # SIGKILL cannot be a rank's own reaction to a peer's death (that raises, then
        # exits): a line blaming a peer was written by another process, or is beside the
        # point. A hung rank's peers were stopped because of it: a reset connection it
        # reports afterwards is the consequence of its hang, not the cause
        hits = [h for h in hits if not h.rule.blame_peer]
    leaves = [h for h in hits if not (h.rule.wrapper or h.rule.fallback)]
    wrappers = [h for h in hits if h.rule.wrapper]
    if leaves:
        return _from_hit(leaves[0], rank, tuple(w.rule.id for w in wrappers))
    if wrappers:  # no cause named: the most severe wrapper's own action, the outer ones listed
        outer = max(wrappers, key=lambda h: SEVERITY[h.action])
        return _from_hit(outer, rank, tuple(w.rule.id for w in wrappers if w is not outer))
    fallbacks = [h for h in hits if h.rule.fallback]
    return _from_hit(fallbacks[0], rank, ()) if fallbacks else None


def _in(rule: Rule, scopes: tuple[str, ...]) -> bool:
    return any(s in scopes for s in rule.scope)


def _killed_from_outside(failure: RankFailure) -> bool:
    return failure.exit.status.signal == signal.SIGKILL and not failure.exit.terminated


def classify_rank(rules: Sequence[Rule], failure: RankFailure) -> Classification:
    """The rank's own evidence first (what it wrote while alive, how it ended); what its
    leftover processes wrote after it died explains it only when nothing else does."""
    found = classify_lines(rules, failure.texts(), failure=failure)
    if found is None and failure.after_exit:
        found = classify_lines(rules, failure.after_exit, failure=failure)
    if found is not None:
        return found
    tail = tuple(strip_prefix(ln) for ln in failure.log_tail[-3:])
    return unclassified(failure.exit.rank, (failure.summary(), *tail))


def agent_ranks(lines: Sequence[str], progressed: bool | None = None) -> list[RankFailure]:
    """A launcher's log (torchrun's, ft_launcher's) as one failure per rank it names,
    the root cause first: see ``supervisor.core.agentlog``."""
    return launcher_ranks(lines, progressed)


def root_tier(c: Classification) -> int:
    """Nearer the cause first: a rank's own failure, a waiting rank's timeout, a peer's
    failure seen from this rank."""
    return 2 if c.peer else 1 if c.waiting else 0


def _root(per_rank: Sequence[Classification]) -> Classification | None:
    """The failure nearest the cause, the earliest of those (``min`` keeps the first)."""
    return min(per_rank, key=root_tier) if per_rank else None


def _the_peer(rules: Sequence[Rule], stopped: Sequence[RankFailure]) -> Classification | None:
    """The peer a reset connection blames, among the ranks we stopped: the first whose own
    text names a specific cause. A rank raises, its ``finally`` closes the process group
    and its peer reads the reset before the rank has even printed its traceback; we stop
    it while it exits. Its text counts only through a rule of its own (not the fallback
    for any exception: being stopped can raise one too)."""
    by_id = {r.id: r for r in rules}
    for failure in stopped:
        c = classify_rank(rules, failure)
        rule = by_id.get(c.rule)
        if rule is not None and rule.patterns and not (c.peer or rule.fallback or rule.hang):
            return c
    return None


def classify(rules: Sequence[Rule], evidence: Evidence) -> Classification:
    """The generation's classification: its root cause's, or the node's if more severe."""
    root = _root([classify_rank(rules, f) for f in evidence.failures])
    if root is not None and root.peer:
        root = _the_peer(rules, evidence.stopped) or root
    if evidence.agent_log and (root is None or root.rule == UNCLASSIFIED):
        progressed = None if evidence.progress is None else evidence.progress > 0
        split = agent_ranks(evidence.agent_log, progressed)
        agent = _root([classify_rank(rules, f) for f in split]) if split else None
        whole = classify_lines(rules, first_failure(evidence.agent_log), scopes=("rank", "agent"))
        if agent is None or agent.rule == UNCLASSIFIED:
            agent = whole
        if agent is not None:
            root = agent
    node = classify_lines(rules, evidence.dmesg, scopes=("dmesg",)) if evidence.dmesg else None
    if root is None:
        return node or unclassified()
    if node is not None and (
        SEVERITY[node.action] > SEVERITY[root.action]
        # an Xid explains what the rank's own text did not
        or (root.rule == UNCLASSIFIED and node.action is not Action.CONTINUE)
    ):
        return replace(node, rank=root.rank, lines=node.lines + root.lines)
    return root
