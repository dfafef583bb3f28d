"""The Lightning callbacks' memory snapshots (``snapshot_every_n_steps``), mixed into them.

Every n optimizer steps, at the end of the training batch (where Lightning's own
``ModelCheckpoint`` saves), the rank hands the daemon (``client.snapshot``): the
LightningModule's ``state_dict``, the optimizers' and lr schedulers' states, the fit
loop's progress (global step, epoch, batch index: Lightning's ``fit_loop.state_dict()``),
the precision plugin's state and the RNG states (torch, CUDA when in use, Python, numpy).

At ``on_fit_start``, before the loops run, a restarted rank asks for it back
(``client.resume``): when the memory snapshot is newer than the checkpoint Lightning
loaded from ``ckpt_path`` (or there is none), the model and the RNG states are loaded
there and the rest goes through Lightning's own restore of the training state, which runs
right after this hook: the optimizers, the schedulers and the loops' position, so that
training continues at the step after the snapshot. A newer disk checkpoint wins instead;
the choice is one line on stderr. Restored once per process: a second ``fit`` in it starts
as Lightning starts it.

Strategies that restore their checkpoint only after this hook
(``restore_checkpoint_after_setup``, e.g. DeepSpeed) would overwrite what was restored
here with the disk's: with them the memory snapshot is used only when no ``ckpt_path``
was given. The dataloader's position comes back when it is stateful (Lightning keeps it
in the fit loop's state); otherwise the epoch's batches start again, as after a
mid-epoch checkpoint.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

from supervisor import client

# the checkpoint keys Lightning's restore_training_state reads (after on_fit_start)
OPTIMIZERS, SCHEDULERS, LOOPS = "optimizer_states", "lr_schedulers", "loops"


class _Once:
    pid: int | None = None  # the process that already resumed (a second fit does not rewind)


def _rng_states() -> dict[str, Any]:
    import torch  # noqa: PLC0415 - Lightning imported it already

    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    import torch  # noqa: PLC0415

    torch.set_rng_state(states["torch"].clone())
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in states:
        numpy.random.set_state(tuple(states["numpy"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.clone() for s in states["cuda"]])


def lightning_state(trainer: Any, pl_module: Any) -> dict[str, Any]:
    """What a snapshot holds, in the shape of Lightning's checkpoint where it has one."""
    state: dict[str, Any] = {
        "state_dict": pl_module.state_dict(),
        # each rank's own optimizer state (no consolidation: a collective every step)
        OPTIMIZERS: [optimizer.state_dict() for optimizer in trainer.optimizers],
        SCHEDULERS: [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs],
        LOOPS: {"fit_loop": trainer.fit_loop.state_dict()},
        "global_step": trainer.global_step,
        "epoch": trainer.current_epoch,
        "rng": _rng_states(),
    }
    precision = trainer.precision_plugin
    held = precision.state_dict()
    if held:
        state[type(precision).__qualname__] = held
    return state


class _Snapshotting:
    """``snapshot_every_n_steps`` of both callbacks: the snapshot after a training batch,
    the restore at the fit's start."""

    snapshot_every_n_steps: int | None
    _snapshotted: int | None  # the global step of the last snapshot taken

    def _init_snapshots(self, every: int | None) -> None:
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise client.SetupError(
                f"{type(self).__name__}(snapshot_every_n_steps=...): None (off) or an int >= 1, not {every!r}"
            )
        self.snapshot_every_n_steps = every
        self._snapshotted = None

    def _snapshot_after_batch(self, trainer: Any, pl_module: Any) -> None:
        every, step = self.snapshot_every_n_steps, trainer.global_step
        # global_step counts optimizer steps: with gradient accumulation it stays put for
        # several batches, and the snapshot is taken once, after the step
        if every is None or step == self._snapshotted or step % every:
            return
        self._snapshotted = step
        client.snapshot(lightning_state(trainer, pl_module), step)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self.snapshot_every_n_steps is None or _Once.pid == os.getpid():
            return
        _Once.pid = os.getpid()
        # Lightning hands a checkpoint's training state to its loops through its connector
        # (2.x, private): where a release has no such place, the disk stays the record
        connector = getattr(trainer, "_checkpoint_connector", None)
        if connector is None or not hasattr(connector, "_loaded_checkpoint"):
            sys.stderr.write("supervisor.client: this Lightning has no checkpoint connector as 2.x has: the "
                             "memory snapshot is not restored (the disk checkpoint, if any, is)\n")
            sys.stderr.flush()
            return
        loaded: dict[str, Any] = connector._loaded_checkpoint or {}
        if trainer.ckpt_path and trainer.strategy.restore_checkpoint_after_setup:
            return  # the disk checkpoint is read after this hook and would overwrite a restore
        disk_step = loaded.get("global_step") if loaded else None
        resumed = client.resume(disk_step if isinstance(disk_step, int) else None, disk_loaded=bool(loaded))
        state = resumed.state
        if state is None:
            return
        pl_module.load_state_dict(state["state_dict"])
        _set_rng_states(state["rng"])
        # the rest as Lightning restores a checkpoint's training state, right after this hook
        training = {k: v for k, v in state.items() if k not in {"state_dict", "rng"}}
        connector._loaded_checkpoint = {**loaded, **training}
