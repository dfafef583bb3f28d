"""The stages that decide a generation's end, on values: no loop, no process."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cli import build_parser
from supervisor.config.build import build_run_config
from supervisor.core.evidence import Evidence, WorkloadRequest
from supervisor.core.jobwide import PeerNews
from supervisor.core.next_step import Basis
from supervisor.core.policy import Budget
from supervisor.core.states import GroupResult
from supervisor.core.types import Action, Decision, Reason
from supervisor.runtime.lifecycle import closing, deciding
from supervisor.runtime.lifecycle.deciding import Judgement, Memory
from supervisor.runtime.lifecycle.ended import GenerationEnded


def ended(**given: object) -> GenerationEnded:
    values: dict[str, object] = {
        "number": 3, "result": GroupResult.FAILED, "started": True, "started_at": 100.0, "stop_wall": None,
        "stop_mono": None, "trouble_at": None, "ranks": (), "unkillable": (), "restart_requested": False,
        "decided": None, "requests": (), "reported": False, "news": None, "iterations": (), "saved": False,
        "bundle": None,
    }  # fmt: skip
    values.update(given)
    return GenerationEnded(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "basis"),
    [
        ({"result": GroupResult.SUCCEEDED}, Basis.SUCCEEDED),
        ({"result": GroupResult.FAILED}, Basis.JUDGE),
        ({"result": GroupResult.STOPPED, "restart_requested": True}, Basis.OPERATOR_RESTART),
        ({"result": GroupResult.STOPPED, "news": (PeerNews.ENDED, "node 1")}, Basis.FOLLOW_PEER),
        # a rank that failed on its own in the same instant says more than the news
        ({"result": GroupResult.FAILED, "news": (PeerNews.ENDED, "node 1")}, Basis.JUDGE),
        ({"result": GroupResult.SUCCEEDED, "requests": (WorkloadRequest(0, "abort", "data"),)}, Basis.JUDGE),
    ],
)
def test_the_basis_of_an_ended_generation(given: dict[str, object], basis: Basis) -> None:
    assert deciding.basis(ended(**given)) is basis


def test_progress_counts_past_the_best_iteration_before_and_remembers_the_new_best() -> None:
    memory = Memory(Budget(3))
    first, memory = deciding.progress(ended(iterations=(10, 12)), memory)
    assert (first, memory.best_iteration) == (3, 12)  # 10..12: three iterations on its own
    again, memory = deciding.progress(ended(iterations=(11, 12)), memory)
    assert (again, memory.best_iteration) == (0, 12)  # nothing past the best: no progress
    silent, memory = deciding.progress(ended(iterations=()), memory)
    assert (silent, memory.best_iteration) == (0, 12)


def test_a_spent_restart_is_a_new_memory_and_the_old_one_stays() -> None:
    before = Memory(Budget(2))
    after = before.spent(now=5.0)
    assert (before.remaining(5.0), after.remaining(5.0)) == (2, 1)


def test_an_operators_restart_is_decided_without_this_nodes_evidence() -> None:
    asked = ended(restart_requested=True)
    judgement = deciding.undisputed(Basis.OPERATOR_RESTART, asked, Memory(Budget(1)), 0.0, "node-a")
    assert (judgement.decision.action, judgement.decision.reason) == (Action.RESTART, Reason.OPERATOR_REQUEST)
    assert judgement.evidence == Evidence((), generation=3, node="node-a")
    assert judgement.classification is None


@pytest.mark.parametrize(
    ("code", "stopped", "decision", "outcome"),
    [
        (0, False, None, "succeeded"),
        (0, False, Decision(Action.CONTINUE, Reason.WORKLOAD_REQUEST, "done"), "continue"),
        (143, True, None, "stopped"),
        (2, False, Decision(Action.ABORT, Reason.NOT_RETRYABLE, "bad"), "abort"),
        (200, False, Decision(Action.RESCHEDULE, Reason.NODE_QUARANTINED, "ecc"), "reschedule"),
        (1, False, None, "failed"),
    ],
)
def test_reason_json_names_how_the_run_ended(
    tmp_path: Path, code: int, stopped: bool, decision: Decision | None, outcome: str
) -> None:
    argv = ["run", "--no-python", "--max-restarts", "3", "true"]
    cfg = build_run_config(build_parser().parse_args(argv), {})
    judgement = None if decision is None else Judgement(Evidence((), generation=1, node="n"), None, decision)
    content = closing.reason(code, cfg, judgement, node="n", restarts_used=1, stopped=stopped, generation=1)
    assert (content["outcome"], content["exit_code"]) == (outcome, code)
