"""What ``ft-supervisor classify`` prints: for people, and as JSON with the field
names of the reason file and the events."""

from __future__ import annotations

from typing import Any

from supervisor.core.classify import Classification
from supervisor.core.types import Decision
from supervisor.postmortem.replay import Judged, ReplayedRun

_ENDS = {
    "succeeded": "no failure: the run succeeded",
    "success": "no failure: the run succeeded",  # reason.json before the vocabulary pass
    "continue": "no failure: a rank asked to end the run",
    "stopped": "no failure ended the run: it was stopped by a signal",
    "unfinished": "the daemon never finished this run (killed?): no reason file",
}


def _classification(c: Classification | None, decision: Decision) -> list[str]:
    detail = f" ({decision.detail})" if decision.detail else ""
    out = [f"decision: {decision.action}{detail}"]
    if c is None:
        return [*out, "rule:     - (nothing this node classified)"]
    inside = f", inside {' > '.join(c.wrapped_by)}" if c.wrapped_by else ""
    return [
        *out,
        f"rule:     {c.rule} [{c.category}, {c.nature}] by {c.source or '-'}{inside}",
        f"          {c.summary}" if c.summary else "",
        f"rank:     {c.rank}"
        + ((f" (blames a peer: {c.blames})" if c.blames else " (blames a peer)") if c.peer else ""),
        "matched:",
        *(f"  {line}" for line in c.lines),
    ]


def render_files(c: Classification, decision: Decision, problems: list[str]) -> str:
    return "\n".join(line for line in (*_classification(c, decision), *problems) if line)


def _short(j: Judged) -> str:
    c = j.classification
    what = "-" if c is None else f"{c.rule}, rank {c.rank}"
    how = "judged here" if j.own else "taken from the event: not this node's judgement"
    return f"generation {j.generation}: {j.decision.action} ({j.decision.reason}) {what}; {how}"


def render_run(replayed: ReplayedRun, differ: list[str] | None = None) -> str:
    code = "" if replayed.exit_code is None else f", exit code {replayed.exit_code}"
    out = [f"run:      {replayed.run_dir}", f"outcome:  {replayed.outcome}{code}"]
    if replayed.final is not None:
        out += _classification(replayed.final.classification, replayed.final.decision)
    else:
        out.append(_ENDS.get(replayed.outcome, "no decision ended the run"))
        last = replayed.last_failure
        if last is not None and last.classification is not None:
            c = last.classification
            out.append(f"last failure, gone on after: generation {last.generation}: {c.rule}, rank {c.rank} "
                       f"-> {last.decision.action} ({last.decision.detail})")  # fmt: skip
    if replayed.judged:
        out += ["decisions:", *(f"  {_short(j)}" for j in replayed.judged)]
    if differ is not None:
        agreed = ["agrees with reason.json"]
        out += ["disagrees with reason.json:", *(f"  {d}" for d in differ)] if differ else agreed
    out += list(replayed.problems)
    return "\n".join(line for line in out if line)


def _judged_json(j: Judged | None) -> dict[str, Any] | None:
    if j is None:
        return None
    c = j.classification
    return {
        "generation": j.generation,
        "own": j.own,
        "rule": None if c is None else c.rule,
        "rank": None if c is None else c.rank,
        "action": str(j.decision.action),
        "reason": str(j.decision.reason),
        "detail": j.decision.detail,
    }


def _decision_json(d: Decision) -> dict[str, str]:
    return {"action": str(d.action), "reason": str(d.reason), "detail": d.detail}


def run_json(replayed: ReplayedRun, differ: list[str] | None = None) -> dict[str, Any]:
    final = replayed.final
    c = None if final is None else final.classification
    return {
        "run_dir": str(replayed.run_dir),
        "outcome": replayed.outcome,
        "exit_code": replayed.exit_code,
        "rule": None if c is None else c.rule,
        "rank": None if c is None else c.rank,
        "classification": None if c is None else c.to_json(),
        "decision": None if final is None else _decision_json(final.decision),
        "last_failure": _judged_json(replayed.last_failure),
        "decisions": [_judged_json(j) for j in replayed.judged],
        "agrees": None if differ is None else not differ,
        "disagreements": differ or [],
        "problems": list(replayed.problems),
    }
