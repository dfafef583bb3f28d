"""What the Lightning callbacks tell the daemon, and when: pure, testable without Lightning.

``supervisor.client.lightning``'s callbacks turn each Lightning hook into one
call here and send the operations they get back. The rules (those of
nvidia-resiliency-ext's ``FaultToleranceSectionsCallback``):

* only a ``fit`` is monitored; ``validate``/``test``/``predict`` runs are not;
* ``setup`` is open from the ``setup`` hook to the first training or validation
  batch (so it covers a checkpoint load);
* every training and validation batch is one ``step`` (a heartbeat follows it;
  a training batch also reports the global step);
* ``checkpointing`` opens when Lightning builds a checkpoint (``on_save_checkpoint``,
  right before the write) and closes at the callback's next hook (a batch start,
  an epoch or validation boundary, the end of training, teardown), when the write,
  the barrier after it and the removal of stale checkpoint files have completed;
  it also covers what little runs before that hook (the next batch's fetch), as
  no Lightning hook follows a save directly;
* an exception closes every section and marks the run failed, except
  ``SystemExit(0)`` (how NeMo's preemption callback stops training), which ends
  the fit as ``teardown`` does; ``teardown`` closes every section;
* training is complete when ``max_steps`` or ``max_epochs`` was reached, or when
  this run made at most one training step (a run resumed after its time limit),
  and never after a failure;
* with ``calculate_timeouts=True`` the daemon is asked to calculate timeouts at
  nvidia-resiliency-ext's points, from what it observed (``Calculation``): the
  heartbeat timeouts once, at the end of a clean fit that loaded a checkpoint and
  saved one; the sections after each completed save and at the end of a clean
  fit, each section once what it must cover was seen (``setup``: a checkpoint
  load; ``step``: more than 16 training steps; ``checkpointing``: a save, unless
  saves are asynchronous), and the out-of-section time at the end once all three were.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from supervisor.client.faults import SimulatedFault

SETUP = "setup"
STEP = "step"
CHECKPOINTING = "checkpointing"
FINISHED_FLAG_ENV = "FAULT_TOL_FINISHED_FLAG_FILE"
# nvidia-resiliency-ext's thresholds for a calculation
MIN_STEPS_FOR_HEARTBEAT_TIMEOUT = 2
MIN_STEPS_FOR_STEP_TIMEOUT = 16

OpKind = Literal["open", "close", "close_all", "fail_all", "iteration", "heartbeat", "loaded", "saved"]


@dataclass(frozen=True, slots=True)
class Op:
    """One client call: ``open``/``close`` a section, ``iteration`` n, ``saved``..."""

    kind: OpKind
    section: str | None = None
    iteration: int | None = None


HEARTBEAT = Op("heartbeat")
CLOSE_ALL = Op("close_all")
FAIL_ALL = Op("fail_all")
LOADED = Op("loaded")
SAVED = Op("saved")


@dataclass(frozen=True, slots=True)
class Progress:
    """Where the trainer stands; ``max_*`` of None or below 1 mean no limit."""

    global_step: int
    max_steps: int | None
    current_epoch: int
    max_epochs: int | None


@dataclass(frozen=True, slots=True)
class Calculation:
    """Timeouts to have the daemon calculate now (``client.calculate_timeouts``)."""

    heartbeat: bool = False
    sections: tuple[str, ...] = ()
    out_of_section: bool = False

    def __bool__(self) -> bool:
        return self.heartbeat or bool(self.sections) or self.out_of_section


class _TrainingPhase:
    """The state of one monitored ``fit``: which sections are open, how it ended."""

    def __init__(self) -> None:
        self.fitting = False  # between setup("fit") and teardown / an exception
        self.open: set[str] = set()
        self.failed = False
        self.train_batches = 0
        self.finished = False  # set by teardown: training is complete
        self.loaded_checkpoint = False
        self.saves = 0  # completed in this fit
        self.saved_since_calculation = False
        self.heartbeat_calculated = False

    # -- hooks -------------------------------------------------------------------------

    def setup(self, stage: str) -> list[Op]:
        if stage != "fit" or self.fitting:
            return []
        self.fitting, self.failed, self.train_batches, self.finished = True, False, 0, False
        self.loaded_checkpoint, self.saves, self.saved_since_calculation = False, 0, False
        self.heartbeat_calculated = False
        self.open.clear()
        return self._open(SETUP)

    def batch_start(self, *, training: bool) -> list[Op]:
        """A training or validation batch begins: setup is over, a step starts."""
        if not self.fitting:
            return []
        if training:
            self.train_batches += 1
        # a step still open lost its end hook (a skipped batch): the new one replaces it
        return [*self.settle(), *self._close(SETUP), *self._close(STEP), *self._open(STEP)]

    def batch_end(self, global_step: int | None = None) -> list[Op]:
        """A batch ended; ``global_step`` for a training batch."""
        if not self.fitting:
            return []
        done = self._close(STEP)
        if global_step is not None:
            done.append(Op("iteration", iteration=global_step))
        return [*done, HEARTBEAT]

    def save_started(self) -> list[Op]:
        """Lightning is about to write a checkpoint."""
        return self._open(CHECKPOINTING) if self.fitting else []

    def settle(self) -> list[Op]:
        """Any hook after a save: the save completed."""
        if CHECKPOINTING not in self.open:
            return []
        self.saves += 1
        self.saved_since_calculation = True
        return [*self._close(CHECKPOINTING), SAVED, HEARTBEAT]

    def loaded(self) -> list[Op]:
        if not self.fitting:
            return []
        self.loaded_checkpoint = True
        return [LOADED]

    def exception(self, *, stop: bool = False) -> list[Op]:
        """An exception left the fit; ``stop``: it was ``SystemExit(0)``, a clean stop."""
        if not self.fitting:
            return []
        if stop:
            return [*self.settle(), *self._end()]
        self.failed = True
        self._end()
        return [FAIL_ALL]  # an exception went through them: no measure of the work

    def teardown(self, stage: str, progress: Progress) -> list[Op]:
        """The fit ended without an exception; ``finished`` says whether training is complete."""
        if stage != "fit" or not self.fitting:
            return []
        self.finished = self.completed(progress)
        return [*self.settle(), *self._end()]

    # -- decisions ---------------------------------------------------------------------

    def heartbeat_calculation(self) -> Calculation:
        """At the end of a fit: the heartbeat timeouts, once, when the fit showed what they
        must cover (a checkpoint load before the first heartbeat, a save between two)."""
        if self.failed or self.heartbeat_calculated:
            return Calculation()
        if (
            self.train_batches < MIN_STEPS_FOR_HEARTBEAT_TIMEOUT
            or not self.loaded_checkpoint
            or not self.saves
        ):
            return Calculation()
        self.heartbeat_calculated = True
        return Calculation(heartbeat=True)

    def section_calculation(self, *, final: bool, async_saves: bool = False) -> Calculation:
        """After a completed save (the next training batch's end) and at the end of a fit
        (``final``): the sections whose work this fit has shown."""
        if self.failed or not (final or self.saved_since_calculation):
            return Calculation()
        self.saved_since_calculation = False
        chosen = [SETUP] if self.loaded_checkpoint else []
        if self.train_batches > MIN_STEPS_FOR_STEP_TIMEOUT:
            chosen.append(STEP)
        if self.saves and not async_saves:  # asynchronous saves vary too much from run to run
            chosen.append(CHECKPOINTING)
        whole = final and self.saves > 0 and {SETUP, STEP} <= set(chosen)
        return Calculation(sections=tuple(chosen), out_of_section=whole)

    def completed(self, progress: Progress) -> bool:
        """Did this fit finish the training (so that no further job is needed)?"""
        if self.failed:
            return False
        if _reached(progress.global_step, progress.max_steps):
            return True
        if _reached(progress.current_epoch, progress.max_epochs):
            return True
        # nvidia-resiliency-ext's rule: a run that made at most one step without failing
        # found nothing left to do (e.g. its time limit had already passed)
        return self.train_batches <= 1

    # -- sections ----------------------------------------------------------------------

    def _open(self, name: str) -> list[Op]:
        if name in self.open:
            return []
        self.open.add(name)
        return [Op("open", name)]

    def _close(self, name: str) -> list[Op]:
        if name not in self.open:
            return []
        self.open.discard(name)
        return [Op("close", name)]

    def _end(self) -> list[Op]:
        self.fitting = False
        self.open.clear()
        return [CLOSE_ALL]


def _reached(value: int, limit: int | None) -> bool:
    return limit is not None and limit > 0 and value >= limit


def finished_flag_path(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The file that tells an outer auto-resume loop that training has finished.

    The daemon always sets it (``--finished-flag-file``, else a file in the run
    directory); None only without a daemon, where no outer loop can be reading it.
    """
    value = environ.get(FINISHED_FLAG_ENV, "")
    return Path(value) if value else None


# nvidia-resiliency-ext's SimulatedFaultParams fields, and the generation (ours)
_FAULT_FIELDS = ("fault_type", "base_delay", "rand_delay", "rank_to_fail", "generation")


def simulated_fault(params: object) -> SimulatedFault | None:
    """``simulated_fault_params`` as a ``faults.SimulatedFault``; ValueError when malformed.

    Accepted: None; a ``SimulatedFault``; an ``FT_SIM_FAULT_DESC`` string
    (``type;rank;delay[;generation]``); or nvidia-resiliency-ext's form, a
    ``SimulatedFaultParams`` or a mapping (a dict, an OmegaConf DictConfig) with
    ``fault_type``, ``base_delay``, optional ``rank_to_fail`` (default: a random
    rank) and ``generation`` (default: every one). ``rand_delay`` is accepted and
    not used: ``faults`` adds its own jitter (0 to 20 % of ``base_delay``).
    """
    if params is None or isinstance(params, SimulatedFault):
        return params
    if isinstance(params, str):
        return SimulatedFault.parse(params)
    fields: dict[str, Any]
    if isinstance(params, Mapping):
        fields = {str(k): v for k, v in params.items()}
        unknown = sorted(set(fields) - set(_FAULT_FIELDS))
        if unknown:
            raise ValueError(f"simulated_fault_params: unknown field(s) {unknown}; known: {_FAULT_FIELDS}")
    else:
        fields = {k: getattr(params, k) for k in _FAULT_FIELDS if hasattr(params, k)}
    missing = [k for k in ("fault_type", "base_delay") if fields.get(k) is None]
    if missing:
        raise ValueError(f"simulated_fault_params: {missing} required, got {params!r}")
    return SimulatedFault(
        fault_type=fields["fault_type"],
        rank=fields.get("rank_to_fail"),
        base_delay=fields["base_delay"],
        generation=fields.get("generation"),
    )
