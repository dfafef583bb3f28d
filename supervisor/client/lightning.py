"""PyTorch Lightning integration: nvidia-resiliency-ext's two callbacks, over ``supervisor.client``.

    from supervisor.client.lightning import FaultToleranceCallback

    trainer = lightning.Trainer(..., callbacks=[FaultToleranceCallback(autoresume=True)])

    ft-supervisor run --nproc-per-node 8 \\
        --ft-rank-section-timeouts setup:600,step:180,checkpointing:420 train.py

Both take nvidia-resiliency-ext's arguments, in its order and with its names
(``nvidia_resiliency_ext.ptl_resiliency``), so that swapping the import is the
whole change: ``autoresume``, ``calculate_timeouts``, ``simulated_fault_params``,
``exp_dir``, ``logger_name``, ``exc_handling_policy``. They work with either
import name of Lightning, ``lightning.pytorch`` and ``pytorch_lightning``: a
Trainer accepts only callbacks of its own package, so an instance is made a
callback of the package(s) this process has imported when it is created (of the
installed one when none is yet); neither is imported otherwise.

What they report during ``fit`` (the rules live in ``_lightning_phase``):

* ``FaultToleranceSectionsCallback``: the ``setup`` section from the ``setup``
  hook to the first batch, one ``step`` section per training and validation
  batch, a ``checkpointing`` section around each checkpoint save, the global
  step after each training batch, checkpoint loads and completed saves;
* ``FaultToleranceCallback``: the same, plus a heartbeat after every batch and
  save, so that it serves an nvidia-resiliency-ext config with heartbeat
  timeouts as well as one with section timeouts (what the daemon does not
  monitor costs nothing).

Arguments, with nvidia-resiliency-ext's meaning:

* ``autoresume``: rank 0 creates the file named by ``FAULT_TOL_FINISHED_FLAG_FILE``
  once training has finished (max_steps or max_epochs reached), never after a
  failure. The daemon always sets the variable (``--finished-flag-file``, else a
  file in its run directory); without a daemon and without the variable there is
  nothing to create, which is logged once.
* ``calculate_timeouts``: have the daemon calculate timeouts from what it
  observed, at nvidia-resiliency-ext's points; they are in force at once and
  take precedence over the configuration. False (the default here): the daemon
  learns them on its own terms (``--ft-learn-timeouts``).
* ``simulated_fault_params`` (testing only): nvidia-resiliency-ext's
  ``SimulatedFaultParams`` or a dict of its fields, plus an optional
  ``generation``, or an ``FT_SIM_FAULT_DESC`` string; arms a
  ``supervisor.client.faults`` fault on the chosen rank when a fit starts,
  disarmed when it ends.
* ``exp_dir``: accepted, unused: the daemon keeps what it learns in its ``--state-dir``.
* ``logger_name``: the logger the callback writes to.
* ``exc_handling_policy``: called with the exception that ended a fit; the
  ``WorkloadControlRequest`` it returns (nvidia-resiliency-ext's or
  ``supervisor.client.nvrx``'s) goes to the daemon, and ``ShutdownWorkload``
  also creates the finished flag.

Ours, keyword-only: ``snapshot_every_n_steps`` (None: off) hands the training state to
the daemon's memory every n optimizer steps and restores it when a fit starts, the newer
of it and ``ckpt_path``'s checkpoint winning (``_lightning_snapshots``).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

from supervisor import client
from supervisor.client import faults, nvrx
from supervisor.client._lightning_phase import (
    FINISHED_FLAG_ENV,
    Calculation,
    Op,
    Progress,
    _TrainingPhase,
    finished_flag_path,
    simulated_fault,
)
from supervisor.client._lightning_snapshots import _Snapshotting

__all__ = ["FINISHED_FLAG_ENV", "FaultToleranceCallback", "FaultToleranceSectionsCallback"]

# the import names of Lightning's trainer package, preferred first (as nvidia-resiliency-ext)
PACKAGES = ("lightning.pytorch", "pytorch_lightning")
DEFAULT_LOGGER = __name__

if not any(importlib.util.find_spec(name.split(".")[0]) for name in PACKAGES):
    raise ImportError(
        "supervisor.client.lightning needs PyTorch Lightning: pip install lightning (or pytorch-lightning)"
    )

ExcHandlingPolicy = Callable[[BaseException], Any]


def callback_bases(modules: dict[str, Any] | None = None) -> tuple[type, ...]:
    """Lightning's ``Callback`` of each trainer package imported in this process, or of
    the installed one (``lightning`` first) when none is imported yet."""
    loaded = sys.modules if modules is None else modules
    bases = [
        m.Callback for name in PACKAGES if (m := loaded.get(name)) is not None and hasattr(m, "Callback")
    ]
    if bases:
        return tuple(bases)
    for name in PACKAGES:
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            return (importlib.import_module(name).Callback,)
    raise ImportError("supervisor.client.lightning needs PyTorch Lightning: pip install lightning")


_bound: dict[tuple[type, tuple[type, ...]], type] = {}


def _bind(cls: type, bases: tuple[type, ...]) -> type:
    """``cls`` made a callback of the packages in ``bases`` (one class per combination)."""
    key = (cls, bases)
    if key not in _bound:
        names = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "_lightning_bound": True}
        _bound[key] = type(cls.__name__, (cls, *bases), names)
    return _bound[key]


def _rebuild(cls: type[_Reporter], state: dict[str, Any]) -> _Reporter:
    obj: _Reporter = _Reporter.__new__(cls)
    obj.__dict__.update(state)
    return obj


class _Reporter(_Snapshotting):
    """The hooks of both callbacks; ``__new__`` makes the instance a Lightning callback."""

    heartbeats: ClassVar[bool] = True
    _lightning_bound: ClassVar[bool] = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        bound = cls if cls._lightning_bound else _bind(cls, callback_bases())
        return object.__new__(bound)

    def __reduce__(self) -> tuple[Any, ...]:
        # the bound class is made at run time and cannot be pickled by name (ddp_spawn
        # pickles the trainer): rebuilt in the other process for its own imports
        public = next(c for c in type(self).__mro__ if not c.__dict__.get("_lightning_bound"))
        return (_rebuild, (public, self.__dict__.copy()))

    def __init__(  # noqa: PLR0917 - nvidia-resiliency-ext's positional order
        self,
        autoresume: bool = False,
        calculate_timeouts: bool = False,
        simulated_fault_params: object = None,
        exp_dir: str | os.PathLike[str] | None = None,
        logger_name: str | None = DEFAULT_LOGGER,
        exc_handling_policy: ExcHandlingPolicy | None = None,
        *,
        snapshot_every_n_steps: int | None = None,
    ) -> None:
        self.logger = logging.getLogger(logger_name)
        self.autoresume = autoresume
        self.calculate_timeouts = calculate_timeouts
        self.simulated_fault_params = simulated_fault_params
        self.provided_exp_dir = exp_dir  # unused: learned timeouts live in the daemon's --state-dir
        self.exc_handling_policy = exc_handling_policy
        if exc_handling_policy is not None and not callable(exc_handling_policy):
            raise client.SetupError(
                f"{type(self).__name__}(exc_handling_policy=...): a function of the exception that "
                f"returns a WorkloadControlRequest, not {exc_handling_policy!r}"
            )
        try:  # a bad one fails here, at once, not when the fit starts
            self._fault = simulated_fault(simulated_fault_params)
        except ValueError as exc:
            raise client.SetupError(f"{type(self).__name__}: {exc}") from exc
        self._fault_thread: faults.SimulatedFaultThread | None = None
        self._phase = _TrainingPhase()
        self._finished_flag: Path | None = None
        self._async_saves = False
        self._init_snapshots(snapshot_every_n_steps)

    # -- Lightning's hooks ---------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        starting = stage == "fit" and not self._phase.fitting
        if starting:
            self._start_fit(trainer)
        self._apply(self._phase.setup(stage))
        f = self._fault
        if starting and f is not None:  # armed once the fit is monitored, on the rank that is to fail
            self._fault_thread = faults.setup_simulated_fault(
                f.fault_type, f.rank, f.base_delay, f.generation
            )

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, object]) -> None:
        self._apply(self._phase.loaded())

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._apply(self._phase.settle())

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: object, batch_idx: int) -> None:
        self._apply(self._phase.batch_start(training=True))

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: object, batch: object, batch_idx: int
    ) -> None:
        self._apply(self._phase.batch_end(trainer.global_step))
        self._snapshot_after_batch(trainer, pl_module)
        if self.calculate_timeouts and not self.heartbeats:
            ask = self._phase.section_calculation(final=False, async_saves=self._async_saves)
            self._calculate(trainer, ask)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._apply(self._phase.settle())

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: object, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._apply(self._phase.batch_start(training=False))

    def on_validation_batch_end(  # noqa: PLR0917 - the signature is Lightning's
        self,
        trainer: Any,
        pl_module: Any,
        outputs: object,
        batch: object,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._apply(self._phase.batch_end())

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._apply(self._phase.settle())

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._apply(self._phase.settle())

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, object]) -> None:
        # Lightning calls this while it builds the checkpoint, right before the write;
        # the next hook closes the section (no hook follows a save directly)
        self._apply(self._phase.save_started())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._apply(self._phase.settle())

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if not self._phase.fitting:
            return
        # SystemExit(0) is how NeMo's preemption callback stops training: not a failure
        stop = isinstance(exception, SystemExit) and not exception.code
        self._apply(self._phase.exception(stop=stop))
        if stop:
            self._end_fit(trainer)
            return
        self._disarm()
        if self.exc_handling_policy is not None:
            self._ask(exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and self._phase.fitting:
            self._apply(self._phase.teardown(stage, _progress(trainer)))
            self._end_fit(trainer)

    # -- the fit -------------------------------------------------------------------------

    def _start_fit(self, trainer: Any) -> None:
        if self.autoresume:
            self._finished_flag = finished_flag_path()
            if self._finished_flag is None:
                self.logger.warning(
                    "autoresume=True: %s is not set (no ft-supervisor daemon), so no finished flag "
                    "will be created", FINISHED_FLAG_ENV,
                )  # fmt: skip
        strategy = getattr(trainer, "strategy", None)
        self._async_saves = hasattr(
            getattr(strategy, "checkpoint_io", None), "maybe_finalize_save_checkpoint"
        )
        if not self.heartbeats and client.is_active():
            self._warn_if_unmonitored()

    def _end_fit(self, trainer: Any) -> None:
        """A fit that ended without a failure (teardown, or a clean stop)."""
        self._disarm()
        done = self._phase.finished or self._phase.completed(_progress(trainer))
        if done and self.autoresume and trainer.is_global_zero:
            self._create_finished_flag()
        if self.calculate_timeouts:
            if self.heartbeats:
                self._calculate(trainer, self._phase.heartbeat_calculation())
            else:
                ask = self._phase.section_calculation(final=True, async_saves=self._async_saves)
                self._calculate(trainer, ask)

    def _disarm(self) -> None:
        if self._fault_thread is not None:
            self._fault_thread.cancel()
            self._fault_thread = None

    def _warn_if_unmonitored(self) -> None:
        monitored = client.state_dict()["ft_supervisor_timeouts"].get("sections") or {}
        if not {"setup", "step", "checkpointing"} & set(monitored):
            self.logger.warning(
                "%s: the daemon monitors none of the sections setup, step, checkpointing: give "
                "them timeouts (--ft-rank-section-timeouts setup:600,step:180,checkpointing:420)",
                type(self).__name__,
            )

    def _calculate(self, trainer: Any, ask: Calculation) -> None:
        if not ask:
            return
        done = client.calculate_timeouts(
            heartbeat=ask.heartbeat, sections=list(ask.sections) if ask.sections else None,
            out_of_section=ask.out_of_section,
        )  # fmt: skip
        if done and trainer.is_global_zero:
            self.logger.info("timeouts calculated (%s): %s", ask, client.state_dict())

    def _ask(self, exception: BaseException) -> None:
        """nvidia-resiliency-ext's exception handling policy: its request goes to the daemon."""
        assert self.exc_handling_policy is not None
        try:
            req = self.exc_handling_policy(exception)
            nvrx.RankMonitorClient().send_workload_control_request(req)
        except Exception:
            # the fit already failed: its own exception is the one to surface
            self.logger.exception("exc_handling_policy failed; the exception goes on as it is")
            return
        self.logger.debug("exc_handling_policy returned %s", req)
        if getattr(req.action, "name", None) == nvrx.WorkloadAction.ShutdownWorkload.name:
            self.logger.warning("shutdown of the workload requested: creating the finished flag")
            self._create_finished_flag(finished_flag_path())

    def _create_finished_flag(self, flag: Path | None = None) -> None:
        flag = flag or self._finished_flag
        if flag is None:
            return
        try:
            flag.parent.mkdir(parents=True, exist_ok=True)
            flag.touch(exist_ok=True)
        except OSError as exc:  # training did finish: say so, and let the run end as it is
            self.logger.error("cannot create the finished flag %s (%s): %s", flag, FINISHED_FLAG_ENV, exc)  # noqa: TRY400
            return
        self.logger.info("training finished: created %s (%s)", flag, FINISHED_FLAG_ENV)

    def _apply(self, ops: Iterable[Op]) -> None:
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
                case "heartbeat" if self.heartbeats:
                    client.heartbeat()
                case "loaded" | "saved":
                    client.report_checkpoint(op.kind)


class FaultToleranceCallback(_Reporter):
    """Report a ``fit``'s sections, heartbeats, steps and checkpoints to the ft-supervisor daemon
    (nvidia-resiliency-ext's ``FaultToleranceCallback``)."""


class FaultToleranceSectionsCallback(_Reporter):
    """Report a ``fit``'s setup/step/checkpointing sections, steps and checkpoints, no
    heartbeats (nvidia-resiliency-ext's ``FaultToleranceSectionsCallback``)."""

    heartbeats = False


def _progress(trainer: Any) -> Progress:
    return Progress(
        global_step=trainer.global_step,
        max_steps=trainer.max_steps,
        current_epoch=trainer.current_epoch,
        max_epochs=trainer.max_epochs,
    )
