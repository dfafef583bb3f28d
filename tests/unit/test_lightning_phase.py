"""The Lightning callbacks' decisions, without Lightning: sections, steps, saves, completion,
calculations; and their arguments against nvidia-resiliency-ext's."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.client._lightning_phase import (
    CLOSE_ALL,
    FAIL_ALL,
    FINISHED_FLAG_ENV,
    HEARTBEAT,
    LOADED,
    SAVED,
    Calculation,
    Op,
    Progress,
    _TrainingPhase,
    finished_flag_path,
    simulated_fault,
)
from supervisor.client.faults import FaultType, SimulatedFault
from tests.support import REPO


def _fitting() -> _TrainingPhase:
    phase = _TrainingPhase()
    assert phase.setup("fit") == [Op("open", "setup")]
    return phase


def _progress(
    step: int = 10, max_steps: int | None = 100, epoch: int = 0, max_epochs: int | None = None
) -> Progress:
    return Progress(global_step=step, max_steps=max_steps, current_epoch=epoch, max_epochs=max_epochs)


def test_only_a_fit_is_monitored() -> None:
    phase = _TrainingPhase()
    for stage in ("validate", "test", "predict"):
        assert phase.setup(stage) == []
    assert phase.batch_start(training=False) == []
    assert phase.batch_end() == []
    assert phase.save_started() == []
    assert phase.loaded() == []
    assert phase.exception() == []
    assert phase.teardown("validate", _progress()) == []
    assert not phase.failed


def test_setup_lasts_until_the_first_batch_which_opens_a_step() -> None:
    phase = _fitting()
    assert phase.setup("fit") == []  # a second setup hook reopens nothing
    assert phase.loaded() == [LOADED]  # the load happens inside setup
    assert phase.batch_start(training=True) == [Op("close", "setup"), Op("open", "step")]
    assert phase.batch_end(7) == [Op("close", "step"), Op("iteration", iteration=7), HEARTBEAT]
    assert phase.batch_start(training=True) == [Op("open", "step")]


def test_a_sanity_check_validation_batch_ends_setup_too() -> None:
    phase = _fitting()
    assert phase.batch_start(training=False) == [Op("close", "setup"), Op("open", "step")]
    assert phase.batch_end() == [Op("close", "step"), HEARTBEAT]  # no iteration for validation
    assert phase.train_batches == 0


def test_a_step_whose_end_hook_never_came_is_replaced_by_the_next() -> None:
    phase = _fitting()
    phase.batch_start(training=True)
    assert phase.batch_start(training=True) == [Op("close", "step"), Op("open", "step")]
    assert phase.train_batches == 2


def test_checkpointing_covers_the_save_until_the_next_hook() -> None:
    phase = _fitting()
    phase.batch_start(training=True)
    phase.batch_end(20)
    assert phase.save_started() == [Op("open", "checkpointing")]
    assert phase.save_started() == []  # a nested save (Lightning's save inside a custom one)
    assert phase.batch_start(training=True) == [
        Op("close", "checkpointing"),
        SAVED,
        HEARTBEAT,
        Op("open", "step"),
    ]
    assert phase.settle() == []  # nothing was being saved


def test_settle_reports_a_save_once() -> None:
    phase = _fitting()
    phase.save_started()
    assert phase.settle() == [Op("close", "checkpointing"), SAVED, HEARTBEAT]
    assert phase.settle() == []


def test_teardown_settles_the_last_save_and_closes_everything() -> None:
    phase = _fitting()
    phase.batch_start(training=True)
    phase.batch_end(100)
    phase.save_started()
    assert phase.teardown("fit", _progress(step=100)) == [
        Op("close", "checkpointing"),
        SAVED,
        HEARTBEAT,
        CLOSE_ALL,
    ]
    assert phase.finished
    assert not phase.open
    assert phase.batch_start(training=True) == []  # after the fit, nothing is monitored
    assert phase.teardown("fit", _progress(step=100)) == []


def test_an_exception_closes_everything_and_never_counts_as_finished() -> None:
    phase = _fitting()
    phase.batch_start(training=True)
    phase.save_started()
    # closed as failed: how long the exception took to surface is no measure of the work
    assert phase.exception() == [FAIL_ALL]
    assert phase.failed and not phase.open
    assert not phase.completed(_progress(step=100))  # max_steps reached, yet it failed
    # Lightning 2 runs no teardown hook after an exception; were one to come, still no flag
    assert phase.teardown("fit", _progress(step=100)) == []
    assert not phase.finished
    assert phase.exception() == []


def test_a_clean_stop_ends_the_fit_as_teardown_does() -> None:
    phase = _fitting()
    phase.batch_start(training=True)
    phase.save_started()
    # SystemExit(0), NeMo's preemption stop: the save completed, the sections were healthy
    assert phase.exception(stop=True) == [Op("close", "checkpointing"), SAVED, HEARTBEAT, CLOSE_ALL]
    assert not phase.failed and not phase.fitting
    assert phase.completed(_progress(step=100))


def _trained(steps: int, *, loaded: bool = False, saves: int = 0) -> _TrainingPhase:
    phase = _fitting()
    if loaded:
        phase.loaded()
    for step in range(steps):
        phase.batch_start(training=True)
        phase.batch_end(step)
        if step < saves:
            phase.save_started()
    phase.settle()
    return phase


@pytest.mark.parametrize(
    ("steps", "loaded", "saves", "final", "expected"),
    [
        # nvidia-resiliency-ext's points: a section once the fit showed what it must cover
        (17, True, 1, True, Calculation(sections=("setup", "step", "checkpointing"), out_of_section=True)),
        (17, True, 1, False, Calculation(sections=("setup", "step", "checkpointing"))),
        (16, True, 1, True, Calculation(sections=("setup", "checkpointing"))),  # step needs > 16
        (17, False, 1, True, Calculation(sections=("step", "checkpointing"))),  # setup needs a load
        (17, True, 0, True, Calculation(sections=("setup", "step"))),  # no save: no out-of-section
        (17, True, 0, False, Calculation()),  # during the fit: only after a save
        (1, False, 0, True, Calculation()),
    ],
)
def test_sections_to_calculate(
    steps: int, loaded: bool, saves: int, final: bool, expected: Calculation
) -> None:
    phase = _trained(steps, loaded=loaded, saves=saves)
    assert phase.section_calculation(final=final) == expected
    if saves and not final:
        assert not phase.section_calculation(final=False)  # once per save


def test_asynchronous_saves_teach_no_checkpointing_timeout() -> None:
    phase = _trained(17, loaded=True, saves=1)
    expected = Calculation(sections=("setup", "step"), out_of_section=True)
    assert phase.section_calculation(final=True, async_saves=True) == expected


def test_heartbeat_timeouts_are_calculated_once_after_a_load_and_a_save() -> None:
    assert not _trained(5, loaded=False, saves=1).heartbeat_calculation()
    assert not _trained(5, loaded=True, saves=0).heartbeat_calculation()
    assert not _trained(1, loaded=True, saves=1).heartbeat_calculation()
    phase = _trained(2, loaded=True, saves=1)
    assert phase.heartbeat_calculation() == Calculation(heartbeat=True)
    assert not phase.heartbeat_calculation()


def test_a_failed_fit_calculates_nothing() -> None:
    phase = _trained(20, loaded=True, saves=2)
    phase.exception()
    assert not phase.heartbeat_calculation()
    assert not phase.section_calculation(final=True)


def test_a_new_fit_starts_afresh() -> None:
    phase = _fitting()
    phase.batch_start(training=True)
    phase.exception()
    assert phase.setup("fit") == [Op("open", "setup")]
    assert not phase.failed and phase.train_batches == 0


@pytest.mark.parametrize(
    ("progress", "batches", "complete"),
    [
        (_progress(step=100, max_steps=100), 50, True),
        (_progress(step=101, max_steps=100), 50, True),
        (_progress(step=99, max_steps=100), 50, False),
        (_progress(step=99, max_steps=-1, epoch=3, max_epochs=3), 50, True),  # epochs reached
        (_progress(step=99, max_steps=-1, epoch=2, max_epochs=3), 50, False),
        (_progress(step=99, max_steps=-1, epoch=9, max_epochs=-1), 50, False),  # unlimited
        (_progress(step=99, max_steps=None, epoch=9, max_epochs=None), 50, False),
        (_progress(step=0, max_steps=0, epoch=0, max_epochs=0), 50, False),  # 0 is no limit
        # at most one step in this run: nothing was left to do (nvidia-resiliency-ext's rule)
        (_progress(step=99, max_steps=1000), 1, True),
        (_progress(step=99, max_steps=1000), 0, True),
        (_progress(step=99, max_steps=1000), 2, False),
    ],
)
def test_training_is_complete_when(progress: Progress, batches: int, complete: bool) -> None:
    phase = _fitting()
    for _ in range(batches):
        phase.batch_start(training=True)
        phase.batch_end(1)
    assert phase.completed(progress) is complete
    phase.teardown("fit", progress)
    assert phase.finished is complete


HOOKS = st.sampled_from(
    ["setup", "setup_validate", "train", "train_end", "val", "val_end", "save", "settle", "load", "exception"]
)


@given(st.lists(HOOKS, max_size=40))
def test_any_hook_order_keeps_sections_consistent(hooks: list[str]) -> None:
    """What the daemon sees: never a section opened twice, closed unopened, or left open."""
    phase = _TrainingPhase()
    seen: set[str] = set()

    def apply(ops: list[Op]) -> None:
        for op in ops:
            if op.kind == "open":
                assert op.section not in seen
                seen.add(op.section or "")
            elif op.kind == "close":
                assert op.section in seen
                seen.discard(op.section or "")
            elif op.kind in ("close_all", "fail_all"):
                seen.clear()
            elif op.kind == "iteration":
                assert not seen & {"step"}

    calls = {
        "setup": lambda: phase.setup("fit"),
        "setup_validate": lambda: phase.setup("validate"),
        "train": lambda: phase.batch_start(training=True),
        "train_end": lambda: phase.batch_end(3),
        "val": lambda: phase.batch_start(training=False),
        "val_end": phase.batch_end,
        "save": phase.save_started,
        "settle": phase.settle,
        "load": phase.loaded,
        "exception": phase.exception,
    }
    for hook in hooks:
        apply(calls[hook]())
        assert seen == phase.open
    apply(phase.teardown("fit", _progress()))
    assert not seen and not phase.open


def test_the_finished_flag_file_comes_from_the_environment(tmp_path: Path) -> None:
    flag = tmp_path / "done"
    assert finished_flag_path({FINISHED_FLAG_ENV: str(flag)}) == flag
    # no daemon (which always sets it) and no outer loop: nothing to create, no setup error
    assert finished_flag_path({}) is None
    assert finished_flag_path({FINISHED_FLAG_ENV: ""}) is None


def _nvrx_parameters(module: str, name: str) -> list[str]:
    """The parameters of nvidia-resiliency-ext's callback, read from its source (importing
    it would import NVRx's client and Lightning)."""
    spec = importlib.util.find_spec("nvidia_resiliency_ext.ptl_resiliency")
    assert spec is not None and spec.submodule_search_locations
    source = Path(spec.submodule_search_locations[0]) / f"{module}.py"
    cls = next(
        n for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.ClassDef) and n.name == name
    )
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert not init.args.kwonlyargs
    return [a.arg for a in init.args.args[1:]]


# what the current nvidia-resiliency-ext (main) has, beyond the 0.4.1 installed here
NVRX_MAIN = ["autoresume", "calculate_timeouts", "simulated_fault_params", "exp_dir", "logger_name"]


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("fault_tolerance_callback", "FaultToleranceCallback"),
        ("fault_tolerance_sections_callback", "FaultToleranceSectionsCallback"),
    ],
)
def test_the_callbacks_take_nvidia_resiliency_ext_arguments_in_its_order(module: str, name: str) -> None:
    import inspect  # noqa: PLC0415

    # importing the integration imports no Lightning (only a callback's creation does)
    lightning = pytest.importorskip("supervisor.client.lightning")

    ours = inspect.signature(getattr(lightning, name).__init__).parameters
    positional = [p for p, v in ours.items() if v.kind is v.POSITIONAL_OR_KEYWORD][1:]
    for theirs in (_nvrx_parameters(module, name), NVRX_MAIN):
        assert positional[: len(theirs)] == theirs
    assert positional == [*NVRX_MAIN, "exc_handling_policy"]  # the sections callback's last one


def test_a_callback_is_made_one_of_each_lightning_package_the_process_imported() -> None:
    callback_bases = pytest.importorskip("supervisor.client.lightning").callback_bases

    class Lit:
        class Callback: ...

    class Ptl:
        class Callback: ...

    assert callback_bases({"lightning.pytorch": Lit}) == (Lit.Callback,)
    assert callback_bases({"pytorch_lightning": Ptl}) == (Ptl.Callback,)
    assert callback_bases({"pytorch_lightning": Ptl, "lightning.pytorch": Lit}) == (
        Lit.Callback,
        Ptl.Callback,
    )


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)


def test_the_client_never_imports_lightning() -> None:
    # nor does the integration: it picks the package when a callback is made, from the imported one
    r = _python(
        "import sys, supervisor.client, supervisor.client._lightning_phase, supervisor.client.lightning\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')]"
    )
    assert r.returncode == 0, r.stderr


def test_without_lightning_the_integration_says_what_to_install() -> None:
    r = _python(
        "import sys\n"
        "sys.modules['lightning'] = sys.modules['pytorch_lightning'] = None\n"
        "import supervisor.client.lightning"
    )
    assert r.returncode == 1
    assert (
        "ImportError: supervisor.client.lightning needs PyTorch Lightning: pip install lightning "
        "(or pytorch-lightning)" in r.stderr
    )


@dataclass
class NvrxParams:
    """The shape of nvidia-resiliency-ext's SimulatedFaultParams."""

    fault_type: str
    base_delay: float
    rand_delay: float = 0.0
    rank_to_fail: int | None = None


def test_simulated_fault_params_in_every_accepted_form() -> None:
    hung = SimulatedFault(FaultType.RANK_HUNG, 1, 30.0)
    assert simulated_fault(None) is None
    assert simulated_fault(hung) is hung
    assert simulated_fault("rank_hung;1;30") == hung
    assert simulated_fault(NvrxParams("rank_hung", 30.0, rand_delay=5.0, rank_to_fail=1)) == hung
    assert simulated_fault({"fault_type": "rank_hung", "base_delay": 30, "rank_to_fail": 1}) == hung
    assert simulated_fault({"fault_type": "random", "base_delay": 1, "generation": 0}) == SimulatedFault(
        FaultType.RANDOM, None, 1.0, 0
    )


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"fault_type": "rank_hung"}, "base_delay"),
        ({"fault_type": "rank_hung", "base_delay": 1, "rank": 1}, "unknown field"),
        ({"fault_type": "meteor", "base_delay": 1}, "meteor"),
        ({"fault_type": "rank_hung", "base_delay": -1}, "delay"),
        ("rank_hung;1", "field"),
        (object(), "fault_type"),
    ],
)
def test_malformed_simulated_fault_params_are_refused(params: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        simulated_fault(params)
