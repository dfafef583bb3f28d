"""How a run ends: the exit-code contract, and the policy presets users name.

The contract (each code configurable) lets Kubeflow, Kubernetes podFailurePolicy,
OSMO exitActions, SLURM RequeueExit and systemd RestartPreventExitStatus tell
the outcomes apart: success 0; abort 2 (not retryable); reschedule 200 (run it
elsewhere; 200-254 is never mistaken for a signal death, 129-192); stopped by
signal N: 128+N; the daemon's own failure: 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from supervisor.core.policy import Policy
from supervisor.core.types import Action

SIGNAL_CODES = range(129, 193)


class OutcomeError(ValueError):
    """A bad exit code or preset: the message names it and the expected form."""


@dataclass(frozen=True, slots=True)
class ExitCodes:
    abort: int = 2
    reschedule: int = 200
    internal: int = 1

    def __post_init__(self) -> None:
        named = {"abort": self.abort, "reschedule": self.reschedule, "internal": self.internal}
        for name, code in named.items():
            if not 1 <= code <= 255:
                raise OutcomeError(f"the {name} exit code must be 1-255, got {code}")
            if code in SIGNAL_CODES:
                raise OutcomeError(
                    f"the {name} exit code {code} would read as a death by signal {code - 128} (129-192)"
                )
        if len(set(named.values())) != len(named):
            raise OutcomeError(f"the abort, reschedule and internal exit codes must differ: {named}")

    def of(self, action: Action) -> int:
        return {
            Action.CONTINUE: 0,
            Action.RESTART: self.internal,  # a run never ends on a restart; if it did, it is our bug
            Action.RESCHEDULE: self.reschedule,
            Action.ABORT: self.abort,
        }[action]


# MindCluster's recover-strategy names (seed 004): how a failure is recovered
PRESETS = ("retry", "recover", "recover-in-place", "dump", "exit")


def apply_presets(names: Iterable[str], policy: Policy | None = None) -> Policy:
    """``retry`` / ``recover-in-place``: restart in place (the default); ``recover``:
    reschedule (alone: at once; after a restart preset: once restarts run out);
    ``exit``: abort (alone: at once; after a restart preset: once restarts run
    out); ``dump``: a dying-gasp save, accepted (it changes no decision)."""
    policy = policy or Policy()
    chosen = [n.strip() for n in names if n.strip()]
    unknown = [n for n in chosen if n not in PRESETS]
    if unknown:
        expected = ", ".join(PRESETS)
        raise OutcomeError(f"unknown policy preset(s) {unknown}: expected a comma list of {expected}")
    in_place = any(n in ("retry", "recover-in-place") for n in chosen)
    for name, action in (("recover", Action.RESCHEDULE), ("exit", Action.ABORT)):
        if name in chosen:
            if in_place:
                policy = replace(policy, on_exhausted=action)
            else:
                policy = replace(policy, on_failure=action, on_exhausted=action)
            break
    return policy
