"""What a person reads when a run gives up: the decision, the root cause, the rest."""

from __future__ import annotations

import time
from pathlib import Path

from supervisor.core.classify import Classification
from supervisor.core.evidence import Evidence
from supervisor.core.types import Decision, RankFailure

INDENT = "    "
TRACE_LINES = 30


def _when(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall))


def _who(failure: RankFailure) -> str:
    e = failure.exit
    return f"rank {e.rank} (local rank {e.local_rank}, pid {e.pid})"


def _detail_lines(failure: RankFailure) -> list[str]:
    if failure.stacks:
        lines = failure.stacks.rstrip().splitlines()
        return [f"{INDENT}stacks:"] + [INDENT * 2 + ln for ln in lines[-TRACE_LINES * 2 :]]
    if failure.error is not None and failure.error.traceback:
        lines = failure.error.traceback.rstrip().splitlines()
        source = "error file"
    elif failure.log_tail:
        lines = list(failure.log_tail)
        source = "stderr"
    else:
        return []
    return [f"{INDENT}{source}:"] + [INDENT * 2 + ln for ln in lines[-TRACE_LINES:]]


def render_failure(
    end: Evidence, classification: Classification | None, decision: Decision, run_dir: Path
) -> str:
    out = [f"run_failed action={decision.action} reason={decision.reason}: {decision.detail}"]
    c = classification
    if c is not None:
        inside = f" (inside {', '.join(c.wrapped_by)})" if c.wrapped_by else ""
        out.append(f"  classified: rule {c.rule} [{c.category}, {c.nature}] by {c.source or '?'}{inside}")
        out.extend(f"{INDENT}matched: {line}" for line in c.lines)
    if end.failures:
        root, *others = end.failures
        out.append(
            f"  root cause: {_who(root)} {root.exit.status.describe()} "
            f"at {_when(root.exit.at_wall)}: {root.summary()}"
        )
        out.extend(_detail_lines(root))
        for other in others:
            out.append(f"  also failed: {_who(other)} {other.exit.status.describe()}: {other.summary()}")
    if end.unkillable:
        out.append(f"  stuck in the kernel after SIGKILL: local rank(s) {list(end.unkillable)}")
    out.append(f"  logs: {run_dir}")
    return "\n".join(out)
