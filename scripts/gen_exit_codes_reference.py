"""Write docs/reference/exit-codes.md from the code's constants: the run's exit-code
contract (supervisor.core.exitcodes.ExitCodes, its options) and the codes of the
other commands (their modules' EXIT_* constants).

    python scripts/gen_exit_codes_reference.py

``tests/unit/test_docs_reference.py`` fails while the file and the constants differ.
"""

from __future__ import annotations

import signal
from dataclasses import fields
from pathlib import Path

from supervisor.cli import EXIT_SIGPIPE
from supervisor.cli import node as node_cmd
from supervisor.cli.control import EXIT_AMBIGUOUS, EXIT_FAILED
from supervisor.core.exitcodes import SIGNAL_CODES, ExitCodes
from supervisor.runtime.lifecycle.daemon import EXIT_SUCCESS, EXIT_USAGE

TARGET = Path(__file__).resolve().parent.parent / "docs" / "reference" / "exit-codes.md"

# what each code of the contract means, by its name in ExitCodes (and the option that changes it)
MEANING = {
    "abort": ("abort: retrying cannot help (also a bad command line or configuration)", "--abort-exit-code"),
    "reschedule": ("reschedule: run the job elsewhere (another node)", "--reschedule-exit-code"),
    "internal": ("the daemon's own internal error", None),
}


def render() -> str:
    codes = ExitCodes()
    lo, hi = SIGNAL_CODES.start, SIGNAL_CODES.stop - 1
    out = [
        "# Exit codes\n\n"
        "<!-- written by scripts/gen_exit_codes_reference.py from supervisor/core/exitcodes.py "
        "and the commands' constants: do not edit -->\n\n"
        "## ft-supervisor run\n\n"
        "The contract a scheduler maps: Kubernetes' `podFailurePolicy`, Kubeflow's "
        "`restartPolicy: ExitCode`, OSMO's `exitActions`, SLURM requeue scripts, systemd's "
        "`RestartPreventExitStatus`. Restarts inside the node never reach the scheduler: only "
        "how the run ended does. Before it exits the daemon writes "
        "[`reason.json`](reason-json.md), which says why.\n\n"
        "| code | meaning | option |\n|---|---|---|\n",
        f"| {EXIT_SUCCESS} | success: every rank of a generation succeeded (or a rank asked to shut the "
        "workload down) | |\n",
    ]
    for f in fields(ExitCodes):
        meaning, option = MEANING[f.name]
        out.append(f"| {getattr(codes, f.name)} | {meaning} | {'`' + option + '`' if option else ''} |\n")
    out.append(f"| 128+N ({lo}-{hi}) | stopped by signal N (SIGTERM: {128 + signal.SIGTERM}) | |\n")
    out.append(
        f"\nThe configurable codes must be 1-255, differ from each other, and stay out of "
        f"{lo}-{hi}, where a code reads as a death by signal. OSMO's cookbooks use 3 for "
        "reschedule: `--reschedule-exit-code 3`.\n"
    )
    out.append(
        "\n## The other commands\n\n| command | code | meaning |\n|---|---|---|\n"
        f"| `status`, `events`, `stop`, `restart` | {EXIT_FAILED} | no daemon found |\n"
        f"| `status`, `events`, `stop`, `restart` | {EXIT_AMBIGUOUS} | no daemon named and not exactly one "
        "in this environment: the candidates are listed, none is acted on |\n"
        f"| `node` | {node_cmd.EXIT_QUARANTINED} | a `--node-quarantine` threshold holds on this node |\n"
        "| `classify --check` | 1 | a replayed decision disagrees with the run's `reason.json` |\n"
        f"| any | {EXIT_USAGE} | a bad command line (one line naming the problem) |\n"
        f"| any | {EXIT_SIGPIPE} | the reader of its output went away (`... \\| head`) |\n"
    )
    return "".join(out)


def main() -> int:
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(render())
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
