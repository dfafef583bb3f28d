"""PyTorch Lightning integration: one callback, a thin adapter over ``supervisor.client``.

    from supervisor.client.lightning import FaultToleranceCallback

    trainer = lightning.Trainer(..., callbacks=[FaultToleranceCallback(autoresume=True)])

    ft-supervisor run --nproc-per-node 8 \\
        --ft-rank-section-timeouts setup:600,step:180,checkpointing:420 train.py

What it reports during ``fit`` (the rules live in ``_lightning_phase``): the
``setup`` section from the ``setup`` hook to the first batch, one ``step``
section per training and validation batch followed by a heartbeat, the global
step after each training batch, a ``checkpointing`` section around each
checkpoint save, and checkpoint loads and completed saves, from which the
daemon learns the setup and checkpointing timeouts. Timeouts are learned by the
daemon, not here. With ``autoresume=True`` rank 0 creates the file named by
``FAULT_TOL_FINISHED_FLAG_FILE`` once training has finished (max_steps or
max_epochs reached), never after an exception: an outer loop that relaunches
the job until that file exists then knows when to stop.

The keyword arguments are nvidia-resiliency-ext's, so that its callback can be
swapped for this one: ``calculate_timeouts`` and ``exp_dir`` are accepted and
have no effect (the daemon learns timeouts and keeps them in its ``--state-dir``);
``simulated_fault_params`` (testing only: NVRx's ``SimulatedFaultParams`` or a
dict of its fields, plus an optional ``generation``, or an ``FT_SIM_FAULT_DESC``
string) arms a ``supervisor.client.faults`` fault on the chosen rank when a fit
starts, disarmed when it ends.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

# Lightning is optional: mypy may run where it is not installed, and then it cannot
# be found and Callback is Any (where it is installed, these two ignores are unused)
try:
    from lightning.pytorch import Callback, LightningModule, Trainer  # type: ignore[import-not-found, unused-ignore]
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("supervisor.client.lightning needs PyTorch Lightning: pip install lightning") from exc

from supervisor import client
from supervisor.client import faults
from supervisor.client._lightning_phase import (
    FINISHED_FLAG_ENV,
    Op,
    Progress,
    _TrainingPhase,
    finished_flag_path,
    simulated_fault,
)

__all__ = ["FINISHED_FLAG_ENV", "FaultToleranceCallback"]

log = logging.getLogger(__name__)


class FaultToleranceCallback(Callback):  # type: ignore[misc, unused-ignore]
    """Report a ``fit``'s sections, steps and checkpoints to the ft-supervisor daemon."""

    def __init__(
        self,
        *,
        autoresume: bool = False,
        exp_dir: str | os.PathLike[str] | None = None,
        calculate_timeouts: bool = True,
        simulated_fault_params: object = None,
    ) -> None:
        self.autoresume = autoresume
        self.exp_dir = exp_dir  # unused: learned timeouts live in the daemon's --state-dir
        self.calculate_timeouts = calculate_timeouts  # unused: the daemon learns timeouts
        self.simulated_fault_params = simulated_fault_params
        self._fault = simulated_fault(simulated_fault_params)  # a bad one fails here
        self._fault_thread: faults.SimulatedFaultThread | None = None
        self._phase = _TrainingPhase()
        self._finished_flag: Path | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit" and not self._phase.fitting:
            self._start_fit()
        _apply(self._phase.setup(stage))

    def _start_fit(self) -> None:
        if self.autoresume:
            self._finished_flag = finished_flag_path()  # fail at once, not after training
        f = self._fault
        if f is not None:  # armed on the rank that is to fail, for this fit
            self._fault_thread = faults.setup_simulated_fault(
                f.fault_type, f.rank, f.base_delay, f.generation
            )

    def _disarm(self) -> None:
        if self._fault_thread is not None:
            self._fault_thread.cancel()
            self._fault_thread = None

    def on_load_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, object]
    ) -> None:
        _apply(self._phase.loaded())

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        _apply(self._phase.settle())

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: object, batch_idx: int
    ) -> None:
        _apply(self._phase.batch_start(training=True))

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: object,
        batch: object,
        batch_idx: int,
    ) -> None:
        _apply(self._phase.batch_end(trainer.global_step))

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        _apply(self._phase.settle())

    def on_validation_batch_start(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        batch: object,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        _apply(self._phase.batch_start(training=False))

    def on_validation_batch_end(  # noqa: PLR0917 - the signature is Lightning's
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: object,
        batch: object,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        _apply(self._phase.batch_end())

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        _apply(self._phase.settle())

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        _apply(self._phase.settle())

    def on_save_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, object]
    ) -> None:
        # Lightning calls this while it builds the checkpoint, right before the write;
        # the next hook closes the section (no hook follows a save directly)
        _apply(self._phase.save_started())

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        _apply(self._phase.settle())

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        _apply(self._phase.exception())
        self._disarm()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        _apply(self._phase.teardown(stage, _progress(trainer)))
        if stage == "fit":
            self._disarm()
            if self._phase.finished and self._finished_flag is not None and trainer.is_global_zero:
                _create(self._finished_flag)


def _progress(trainer: Trainer) -> Progress:
    return Progress(
        global_step=trainer.global_step,
        max_steps=trainer.max_steps,
        current_epoch=trainer.current_epoch,
        max_epochs=trainer.max_epochs,
    )


def _create(flag: Path) -> None:
    flag.parent.mkdir(parents=True, exist_ok=True)
    flag.touch(exist_ok=True)
    log.info("training finished: created %s (%s)", flag, FINISHED_FLAG_ENV)


def _apply(ops: Iterable[Op]) -> None:
    for op in ops:
        match op.kind:
            case "open" if op.section is not None:
                client.start_section(op.section)
            case "close" if op.section is not None:
                client.end_section(op.section)
            case "close_all":
                client.end_all_sections()
            case "fail_all":
                client.end_all_sections(failed=True)
            case "iteration" if op.iteration is not None:
                client.report_iteration(op.iteration)
            case "heartbeat":
                client.heartbeat()
            case "loaded" | "saved":
                client.report_checkpoint(op.kind)
