"""Megatron-style fault-tolerance hooks (Megatron-LM's ``ft_integration``), over ft-supervisor.

Module functions with module state, called from the training loop where
Megatron-LM and Megatron-Bridge call theirs::

    from supervisor.client import megatron as ft

    ft.setup(save_dir=args.save)                 # opens `setup`
    ft.maybe_setup_simulated_fault()             # FT_SIM_FAULT_DESC, for tests
    load_checkpoint(...); ft.on_checkpoint_loaded(is_local_chkpt=False)
    held = ft.restore(disk_iteration=iteration, disk_loaded=True)   # memory, when newer
    if held is not None:
        iteration, state = held; load_state(state)
    while training:
        ft.on_training_step_start(iteration)     # closes `setup`, opens `step`
        train_step()
        ft.on_training_step_end(snapshot=state_dict)   # closes `step`; snapshot: optional
        if evaluating:
            for batch in valid:
                ft.on_eval_step_start(); eval_step(); ft.on_eval_step_end()
        if saving:
            ft.on_checkpointing_start(); save(); ft.on_checkpointing_end(is_async_finalization=False)
        ft.on_checkpointing_start(); finalize_async(); ft.on_checkpointing_end(is_async_finalization=True)
    ft.shutdown()                                # or ft.abort() after a failure

Every function is a no-op until ``setup()`` has run (and after ``shutdown()``
or ``abort()``); without a daemon every call is a no-op after the client's one
warning. Run with the sections configured, e.g.
``--ft-rank-section-timeouts setup:600,step:180,checkpointing:420
--ft-rank-out-of-section-timeout 300`` (a ``none`` timeout: monitored, learned).

Differences from Megatron's hooks, on purpose:

* Warm-up. Megatron leaves the first ``--ft-num-warmup-iters`` training steps
  out of ``step`` (they count as out-of-section time). Here every training step
  opens ``step`` and the daemon's ``--ft-num-warmup-iterations`` (default 5, as
  Megatron's) decides which are warm-up: those are held to the ``warmup``
  pseudo-section timeout if one is configured, otherwise to none, and never
  teach the ``step`` timeout. Doing both would add the two warm-ups up; doing
  it only here would leave warm-up steps unwatched, since the daemon holds no
  one to the out-of-section timeout before its first ``step``. Evaluation
  keeps Megatron's rule: the first ``num_warmup_iters`` steps of every
  evaluation round stay out of ``step`` (the daemon's warm-up counts a
  generation's first steps, not each round's).
* Learned timeouts need no collective and no ``--calc-ft-timeouts``: the daemon
  measures every interval and learns at the end of each generation (``step``
  after 16 timed steps, ``checkpointing`` after a save, ``setup`` after a
  persistent load). ``save_dir`` is optional: with it, rank 0 keeps
  ``<save_dir>/ft_state.json`` (NVRx's form and ours, see ``nvrx``) at every
  save and at shutdown, and ``setup()`` loads it, so a run moved to another
  node, whose daemon has learned nothing yet, keeps its timeouts. What the
  daemon learned itself wins over the file. Unlike Megatron, which never
  updates ``checkpointing`` with async saves, the daemon learns it from every
  completed ``checkpointing`` section, async finalizations included.
* ``on_checkpointing_end(is_async_finalization=False)`` reports a completed
  save to the daemon; a persistent (non-local) load reports a load.
* ``abort()`` stops monitoring without writing the state file (Bridge's abort).
* Ours: ``on_training_step_end(snapshot=...)`` hands the state after the step (a mapping, or
  a function that returns one, called only while monitored) to the daemon's memory
  (``client.snapshot``) as that of iteration ``iteration + 1``, the number Megatron saves a
  checkpoint under; ``restore(disk_iteration=...)`` returns it when it is newer than the
  disk checkpoint (``client.resume``: the choice is one line on stderr).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor import client
from supervisor.client import faults
from supervisor.client.nvrx import OURS_KEY, RankMonitorClient

__all__ = [
    "STATE_FILE",
    "abort",
    "get_rank_monitor_client",
    "maybe_setup_simulated_fault",
    "on_checkpoint_loaded",
    "on_checkpointing_end",
    "on_checkpointing_start",
    "on_eval_step_end",
    "on_eval_step_start",
    "on_training_step_end",
    "on_training_step_start",
    "restore",
    "setup",
    "shutdown",
]

STATE_FILE = "ft_state.json"
SETUP, STEP, CHECKPOINTING = "setup", "step", "checkpointing"

logger = logging.getLogger(__name__)

# what on_training_step_end(snapshot=) takes: the state, or a function that builds it
SnapshotArg = Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None


@dataclass
class _State:
    cli: RankMonitorClient
    state_path: Path | None
    eval_warmup: int
    is_rank0: bool
    setup_open: bool = True
    train_iters: int = 0  # training steps seen by this process
    iteration: int = 0  # the running step's iteration (Megatron's, else train_iters)
    eval_iter: int = 0  # index in the current evaluation round


class _Holder:
    state: _State | None = None  # set by setup(), cleared by shutdown() and abort()


_held = _Holder()


def get_rank_monitor_client() -> RankMonitorClient | None:
    """The underlying NVRx-style client, or None before ``setup()``."""
    return _held.state.cli if _held.state is not None else None


def setup(save_dir: str | os.PathLike[str] | None = None, num_warmup_iters: int | None = None) -> None:
    """Connect, load ``<save_dir>/ft_state.json`` if there is one, and open ``setup``.

    ``num_warmup_iters``: evaluation steps per round left out of ``step``
    (default: the daemon's ``--ft-num-warmup-iterations``). Training warm-up is
    the daemon's alone.
    """
    if _held.state is not None:
        raise RuntimeError("supervisor.client.megatron: setup() was already called")
    if num_warmup_iters is not None and num_warmup_iters < 0:
        raise ValueError(f"num_warmup_iters must be >= 0, not {num_warmup_iters}")
    cli = RankMonitorClient()
    cli.init_workload_monitoring()
    daemon_warmup = client.state_dict()[OURS_KEY].get("warmup_iterations")
    daemon_warmup = daemon_warmup if isinstance(daemon_warmup, int) else 0
    state_path = None
    if save_dir is not None:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        state_path = Path(save_dir) / STATE_FILE
        saved = _read_state(state_path)
        if saved is not None:
            cli.load_state_dict(saved)
    _held.state = _State(
        cli=cli,
        state_path=state_path,
        eval_warmup=daemon_warmup if num_warmup_iters is None else num_warmup_iters,
        is_rank0=int(os.environ.get("RANK") or 0) == 0,
    )
    cli.start_section(SETUP)


def _close_setup(s: _State) -> None:
    if s.setup_open:
        s.cli.end_section(SETUP)
        s.setup_open = False


def on_training_step_start(iteration: int | None = None) -> None:
    """Before a training step: close ``setup`` (first time), report the iteration, open ``step``.

    ``iteration``: Megatron's iteration number; by default the number of
    training steps this process has run.
    """
    s = _held.state
    if s is None:
        return
    _close_setup(s)
    s.eval_iter = 0  # training resumed: the next evaluation is a new round
    s.iteration = s.train_iters if iteration is None else iteration
    client.report_iteration(s.iteration)
    s.cli.start_section(STEP)


def on_training_step_end(snapshot: SnapshotArg = None) -> None:
    """After a training step: close ``step``.

    ``snapshot``: the training state after this step (model, optimizer, RNG, data position:
    what ``restore()`` is to give back), or a function that returns it, called only while
    monitored; held in the daemon's memory as iteration ``iteration + 1``. None: no snapshot.
    """
    s = _held.state
    if s is None:
        return
    s.cli.end_section(STEP)
    s.train_iters += 1
    if snapshot is not None:
        client.snapshot(snapshot() if callable(snapshot) else snapshot, s.iteration + 1)


def restore(
    disk_iteration: int | None = None, *, disk_loaded: bool = False
) -> tuple[int, dict[str, Any]] | None:
    """``(iteration, state)`` of the memory snapshot when it is newer than the disk checkpoint
    at ``disk_iteration`` (None: there is none; ``disk_loaded``: it is already loaded, and wins
    a tie), else None: resume from the disk checkpoint, or from the beginning. The choice is
    one line on stderr (``client.resume``). Works before ``setup()`` too.
    """
    resumed = client.resume(disk_iteration, disk_loaded=disk_loaded)
    if resumed.state is None or resumed.choice.step is None:
        return None
    return resumed.choice.step, resumed.state


def on_eval_step_start() -> None:
    """Before an evaluation step: close ``setup`` (first time); open ``step`` after the round's warm-up."""
    s = _held.state
    if s is None:
        return
    _close_setup(s)
    if s.eval_iter >= s.eval_warmup:
        s.cli.start_section(STEP)


def on_eval_step_end() -> None:
    s = _held.state
    if s is None:
        return
    if s.eval_iter >= s.eval_warmup:
        s.cli.end_section(STEP)
    s.eval_iter += 1


def on_checkpointing_start() -> None:
    """Before a save, or an asynchronous save's finalization."""
    s = _held.state
    if s is not None:
        s.cli.start_section(CHECKPOINTING)


def on_checkpointing_end(is_async_finalization: bool = False) -> None:
    """After a save (``False``: a completed save is reported) or a finalization (``True``)."""
    s = _held.state
    if s is None:
        return
    s.cli.end_section(CHECKPOINTING)
    if not is_async_finalization:
        client.report_checkpoint("saved")
        _save_state(s)


def on_checkpoint_loaded(is_local_chkpt: bool = False) -> None:
    """After a load; a persistent (not local) one lets the daemon learn ``setup``."""
    s = _held.state
    if s is not None and not is_local_chkpt:
        client.report_checkpoint("loaded")


def shutdown() -> None:
    """End of training: rank 0 writes the state file; monitoring stops."""
    s = _held.state
    if s is None:
        return
    _save_state(s)
    s.cli.shutdown_workload_monitoring()
    _held.state = None


def abort() -> None:
    """After a failure: monitoring stops, nothing is written."""
    s = _held.state
    if s is None:
        return
    s.cli.shutdown_workload_monitoring()
    _held.state = None


def maybe_setup_simulated_fault(
    fault_type: faults.FaultType | str | None = None,
    rank: int | str | None = None,
    base_delay: float | None = None,
    generation: int | str | None = None,
) -> faults.SimulatedFaultThread | None:
    """``faults.setup_simulated_fault`` (``FT_SIM_FAULT_DESC`` by default), once ``setup()`` ran."""
    if _held.state is None:
        return None
    return faults.setup_simulated_fault(fault_type, rank, base_delay, generation)


# -- the state file ----------------------------------------------------------------------


def _read_state(path: Path) -> Any:
    try:
        with path.open() as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("FT: ignoring unreadable %s: %s", path, exc)
        return None


def _save_state(s: _State) -> None:
    if s.state_path is None or not s.is_rank0 or not client.is_active():
        return
    state = s.cli.state_dict()
    tmp = s.state_path.with_name(f".{s.state_path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        tmp.replace(s.state_path)  # readers never see half a file
    except OSError as exc:
        logger.warning("FT: could not write %s: %s", s.state_path, exc)
        tmp.unlink(missing_ok=True)
