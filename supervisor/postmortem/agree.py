"""Does the offline judgement agree with the daemon's own reason file?

What agreement means:

* every decision the node judged from its own evidence (the reasons the policy
  gives: ``rank_failed``, ``rank_hung``, ``restarts_exhausted``, ``classified``...)
  gets the same rule, rank, action and reason from the replay as in its
  ``decision`` event;
* the run's end: the same ``outcome`` as reason.json's. When a failure ended the
  run, the same rule, rank, and decision (action and reason); when none did
  (success, a workload's ``continue``, stopped by a signal), no failure on either
  side, and the same ``last_failure`` (generation, rule, rank, action), or none;
* decisions this node did not judge (an operator's restart; a peer's failure, a
  membership change, a lost node, the rendezvous, on several nodes) have no
  classification of their own: their action comes from the event, and agreement
  is that the replay carries what the daemon carried: nothing after a follow or
  an operator's restart, the node's earlier judgement when the job adopted another
  node's decision; the reason file's rule and rank say which;
* not comparable: a run the daemon never finished (no reason file), and a run
  classified by a plugin this process cannot load (its classification cannot be
  repeated here; ``ReplayedRun.problems`` says which).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisor.postmortem.replay import Judged, ReplayedRun


def _judged(j: Judged | None) -> dict[str, Any]:
    c = None if j is None else j.classification
    return {
        "rule": None if c is None else c.rule,
        "rank": None if c is None else c.rank,
        "action": None if j is None else str(j.decision.action),
        "reason": None if j is None else str(j.decision.reason),
    }


def _differ(
    what: str, mine: Mapping[str, Any], theirs: Mapping[str, Any], keys: tuple[str, ...]
) -> list[str]:
    bad = [k for k in keys if mine.get(k) != theirs.get(k)]
    if not bad:
        return []
    ours = ", ".join(f"{k}={mine.get(k)!r}" for k in keys)
    daemon = ", ".join(f"{k}={theirs.get(k)!r}" for k in keys)
    return [f"{what}: classify says {ours}; the daemon said {daemon}"]


def _end(replayed: ReplayedRun, reason: Mapping[str, Any]) -> list[str]:
    out = []
    decision = reason.get("decision") or {}
    if replayed.final is not None or reason.get("rule") is not None:
        daemon = {"rule": reason.get("rule"), "rank": reason.get("rank"),
                  "action": decision.get("action"), "reason": decision.get("reason")}  # fmt: skip
        out += _differ("the decision the run ended on", _judged(replayed.final), daemon,
                       ("rule", "rank", "action", "reason"))  # fmt: skip
    theirs = reason.get("last_failure")
    mine = replayed.last_failure
    if theirs is None and mine is None:
        return out
    if theirs is None or mine is None:
        said = "none" if theirs is None else f"{theirs.get('rule')} (rank {theirs.get('rank')})"
        found = "none" if mine is None else f"{_judged(mine)['rule']} (rank {_judged(mine)['rank']})"
        return [
            *out,
            "the last failure the run went on after: "
                f"classify says {found}; the daemon said {said}",
        ]
    ours = {**_judged(mine), "generation": mine.generation}
    return out + _differ("the last failure the run went on after", ours, theirs,
                         ("generation", "rule", "rank", "action"))  # fmt: skip


def disagreements(replayed: ReplayedRun, reason: Mapping[str, Any]) -> list[str] | None:
    """What the replay and the daemon disagree on (empty: they agree); None when
    they cannot be compared (see the module's docstring)."""
    classifiers = {j.event.get("classifier") for j in replayed.judged}
    if replayed.exit_code is None or classifiers & set(replayed.missing):
        return None
    out = []
    for j in replayed.judged:
        if j.own:
            e = j.event
            out += _differ(f"generation {j.generation}'s decision", _judged(j), e,
                           ("rule", "rank", "action", "reason"))  # fmt: skip
    if replayed.outcome != reason.get("outcome"):
        out.append(f"outcome: classify says {replayed.outcome!r}; the daemon said {reason.get('outcome')!r}")
    return out + _end(replayed, reason)
