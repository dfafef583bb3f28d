"""Write docs/reference/reason-json.md: the fields of ``reason.json``, read off what the
daemon's own code writes (supervisor.runtime.lifecycle.closing.reason) for a run that
succeeded, one that a failure ended, and one that went on after a failure.

    python scripts/gen_reason_reference.py

The meanings are written here, once, by field name; a field the code writes that has no
meaning here stops the script, and ``tests/unit/test_docs_reference.py`` fails while the
page and the code differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.cli import build_parser
from supervisor.config.build import build_run_config
from supervisor.core.classify import Classification
from supervisor.core.evidence import Evidence
from supervisor.core.types import Action, Decision, ExitStatus, RankExit, RankFailure, Reason
from supervisor.runtime.lifecycle.closing import reason
from supervisor.runtime.lifecycle.deciding import Judgement

TARGET = Path(__file__).resolve().parent.parent / "docs" / "reference" / "reason-json.md"

INTRO = """\
# reason.json

<!-- written by scripts/gen_reason_reference.py from supervisor/runtime/lifecycle/closing.py:
     do not edit -->

Before it exits, the daemon writes why the run ended on this node: one JSON object, in
the run directory (`<log-dir>/<run id>/<stamp>-<host>-<pid>/reason.json`), whole; and,
with `--reason-file PATH`, a copy there bounded to 4096 bytes (Kubernetes keeps no more of
`/dev/termination-log`): still one JSON object, its bulky fields shortened or dropped until it
fits, with `"truncated": true` and the full record's path in `"full"`. It is written
atomically (a reader never sees half a file); a failure to write it is reported
(`reason_unwritable`) and never changes the exit code, which carries the decision too.
The names are the events' names (see [Events](events.md)). `ft-supervisor classify RUN_DIR
--check` replays a run directory and compares its judgement with this file. A field written
in every run that does not apply to this one (the rule of a run that succeeded) is null, or
an empty list.

Readers accept `success`, the name runs before 2026-11-27 wrote for `succeeded`.
"""

# what each field means; a field the code writes and this table lacks stops the script
FIELDS: dict[str, str] = {
    "outcome": "how the run ended: `succeeded`; `continue` (a rank asked to end the run); `stopped` "
    "(by a signal); the action that ended it, `reschedule` or `abort`; `failed` when the daemon "
    "itself failed",
    "exit_code": "the code the daemon exits with ([Exit codes](exit-codes.md))",
    "run_id": "the run id (`--rdzv-id`, or a fresh uuid)",
    "node": "this node's name",
    "generation": "the last generation (null before the first started)",
    "restarts_used": "restarts spent from the budget",
    "max_restarts": "the budget (`--max-restarts`)",
    "t_wall": "when the file was written (unix seconds)",
    "decision": "the decision the run ended on: `action`, `reason` (a machine-readable word: "
    "`rank_failed`, `rank_hung`, `restarts_exhausted`, `not_retryable`, `repeated`...) and `detail` "
    "(a sentence); null when it succeeded or was stopped",
    "rule": "the id of the rule that classified the failure ([Failure rules](rules.md))",
    "classification": "what the classifier made of it: rule, category, nature, action, repeat, "
    "rank, the evidence lines, the wrappers it was found inside, the plugin that said so",
    "rank": "the rank the classification blames",
    "root_cause": "the earliest failed rank: `rank`, `local_rank`, `pid`, `exit` (code or signal), "
    "`failed_at` and a one-line `summary`",
    "evidence_lines": "the log lines the rule matched",
    "failures": "every failed rank, earliest first, as `root_cause`",
    "unkillable": "local ranks that outlived SIGKILL (stuck in the kernel)",
    "bundle": "the hang's diagnostic bundle directory, when a hang ended the run",
    "job_blame": "when the last decision followed a hang across the job: the job's one blame, the same "
    "on every node: `rule` (`desync`, `wavefront`, `absent`, `own_code`, `node_silent`, `progress`), "
    "the culprit `ranks` and their `nodes` (node ranks), `detail`, the `silent` nodes (no summary "
    "in time), and for a desync the `mismatch` (`group`, `seq`, and each rank's `op`, `sizes` and "
    "call site `at`)",
    "last_failure": "when the run went on after a failure (and then succeeded or was stopped): that "
    "failure's `generation`, `rule`, `rank`, `action`, `detail` and `bundle`",
}

WHEN = {
    "succeeded": "a run that succeeded",
    "failed": "a run a failure ended",
    "went_on": "a run that succeeded after a restart",
}


def _written() -> dict[str, dict[str, Any]]:
    """What closing.reason writes in each case, with real values of the daemon's types."""
    script = str(TARGET.parents[2] / "scripts" / "train.py")
    cfg = build_run_config(build_parser().parse_args(["run", script]), {})
    failure = RankFailure(
        RankExit(local_rank=1, rank=1, pid=4242, status=ExitStatus(code=1), at=1.0, at_wall=1.0)
    )
    evidence = Evidence(failures=(failure,), generation=0, node="node-a")
    classification = Classification("P9", "python", "transient", Action.RESTART, rank=1, lines=("Error",))
    restart = Judgement(
        evidence, classification, Decision(Action.RESTART, Reason.RANK_FAILED, "rank 1 failed")
    )
    blamed: dict[str, Any] = {"rule": "own_code", "ranks": [3], "nodes": [1], "detail": "...", "silent": []}
    abort = Judgement(
        evidence, classification, Decision(Action.ABORT, Reason.NOT_RETRYABLE, "no"), job_blame=blamed
    )
    common: dict[str, Any] = {"node": "node-a", "restarts_used": 0, "stopped": False, "generation": 0}
    return {
        "succeeded": reason(0, cfg, None, **common),
        "failed": reason(2, cfg, abort, **common),
        "went_on": reason(0, cfg, restart, **common),
    }


def render() -> str:
    written = _written()
    order: list[str] = []
    for content in written.values():
        order += [k for k in content if k not in order]
    unknown = [k for k in order if k not in FIELDS]
    if unknown:
        raise SystemExit(f"reason.json fields without a meaning in {__file__}: {unknown}")
    out = [INTRO, "\n| field | written in | meaning |\n|---|---|---|\n"]
    for key in order:
        cases = [WHEN[case] for case, content in written.items() if key in content]
        where = "every run" if len(cases) == len(written) else "; ".join(cases)
        out.append(f"| `{key}` | {where} | {FIELDS[key]} |\n")
    return "".join(out)


def main() -> int:
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(render())
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
