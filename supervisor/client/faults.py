"""Simulated faults, to test that a workload really is recovered (testing only).

Megatron-LM's ``maybe_setup_simulated_fault`` and nvidia-resiliency-ext's
``SimulatedFaultParams``, for any script::

    from supervisor.client import faults

    faults.setup_simulated_fault()                      # reads FT_SIM_FAULT_DESC, if set
    faults.setup_simulated_fault("rank_hung", rank=1, base_delay=30.0, generation=0)

``FT_SIM_FAULT_DESC="type;rank;delay[;generation]"``: Megatron-LM's format, with
an optional fourth field:

  type        ``rank_hung``    the process SIGSTOPs itself (every thread stops)
              ``sleep``        the main thread stops making progress, forever; other
                               threads run on (a rank stuck in a collective)
              ``rank_killed``  the process SIGKILLs itself
              ``exception``    the main thread raises ``SimulatedFaultError``
              ``random``       one of the four
  rank        the global rank that fails; empty or ``random``: one picked at random
  delay       ``base_delay`` seconds; the fault comes ``base_delay * (1 + 0.2 * r)``
              seconds after the set-up, r uniform in [0, 1)
  generation  only in this generation (``TORCHELASTIC_RESTART_COUNT``); empty, absent
              or ``any``: in every generation

Random choices (rank, type, r) come from a generator seeded with
``TORCHELASTIC_RUN_ID`` and the generation, so every rank draws the same ones
without a collective, and a run is reproducible; they change from one
generation to the next.

The fault fires from a daemon thread. ``sleep`` and ``exception`` act in the
main thread through a signal (``FAULT_SIGNAL``) whose Python handler runs
there: CPython runs signal handlers in the main thread, between bytecodes, and
a signal sent to that thread interrupts a blocking system call (``time.sleep``,
a socket read...) so the handler runs at once. C code that holds the main
thread without returning to the interpreter delays the fault until it returns.
Their handler is installed by ``setup_simulated_fault``, which must then run in
the main thread (as Megatron's does).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import FrameType

__all__ = [
    "ENV_FAULT",
    "FAULT_SIGNAL",
    "FaultType",
    "SimulatedFault",
    "SimulatedFaultError",
    "SimulatedFaultThread",
    "setup_simulated_fault",
]

ENV_FAULT = "FT_SIM_FAULT_DESC"
# a real-time signal next to the client's stack-dump one (SIGRTMIN + 4)
FAULT_SIGNAL = signal.SIGRTMIN + 5
RANDOM = "random"
ANY = "any"


class FaultType(StrEnum):
    RANK_HUNG = "rank_hung"
    SLEEP = "sleep"
    RANK_KILLED = "rank_killed"
    EXCEPTION = "exception"
    RANDOM = "random"


CONCRETE = (FaultType.RANK_HUNG, FaultType.SLEEP, FaultType.RANK_KILLED, FaultType.EXCEPTION)
IN_MAIN_THREAD = (FaultType.SLEEP, FaultType.EXCEPTION)


class SimulatedFaultError(RuntimeError):
    """Raised in the main thread by an ``exception`` fault."""


@dataclass(frozen=True, slots=True)
class SimulatedFault:
    """What to break, where and when. ``rank`` None: a random rank; ``generation`` None: every one."""

    fault_type: FaultType
    rank: int | None
    base_delay: float
    generation: int | None = None

    def __post_init__(self) -> None:
        # values built directly are checked too, with the messages parse() gives
        object.__setattr__(self, "fault_type", _fault_type(self.fault_type))
        if self.rank is not None and not _count(self.rank):
            raise ValueError(f"simulated fault: rank must be an integer >= 0 or 'random', not {self.rank!r}")
        if not _seconds(self.base_delay):
            raise ValueError(f"simulated fault: delay must be seconds >= 0, not {self.base_delay!r}")
        object.__setattr__(self, "base_delay", float(self.base_delay))
        if self.generation is not None and not _count(self.generation):
            raise ValueError(
                f"simulated fault: generation must be an integer >= 0 or 'any', not {self.generation!r}"
            )

    @classmethod
    def parse(cls, desc: str) -> SimulatedFault:
        """``type;rank;delay[;generation]``; ValueError naming the bad field."""
        fields = [f.strip() for f in desc.split(";")]
        if len(fields) not in (3, 4):
            raise ValueError(
                f"simulated fault {desc!r}: expected 'type;rank;delay[;generation]', "
                f"got {len(fields)} field(s)"
            )
        kind, rank, delay = fields[:3]
        generation = fields[3] if len(fields) == 4 else ""
        return cls(_fault_type(kind), _rank(rank), _delay(delay), _generation(generation))

    def describe(self) -> str:
        """The ``FT_SIM_FAULT_DESC`` form: ``parse(f.describe()) == f``."""
        rank = RANDOM if self.rank is None else str(self.rank)
        generation = ANY if self.generation is None else str(self.generation)
        return f"{self.fault_type};{rank};{self.base_delay!r};{generation}"

    def applies_to(self, generation: int) -> bool:
        return self.generation is None or self.generation == generation

    def resolve(self, world_size: int, seed: str) -> tuple[FaultType, int, float]:
        """The fault type, the failing rank and the delay: the same for every rank given ``seed``."""
        if world_size < 1:
            raise ValueError(f"simulated fault: world size must be >= 1, not {world_size}")
        if self.rank is not None and self.rank >= world_size:
            raise ValueError(f"simulated fault: rank {self.rank} is not in a world of {world_size} rank(s)")
        # a str seed is hashed with sha512: the same draws in every process
        rng = random.Random(f"ft-simulated-fault:{seed}")  # noqa: S311 (not cryptography)
        rank = rng.randrange(world_size) if self.rank is None else self.rank
        kind = rng.choice(CONCRETE) if self.fault_type is FaultType.RANDOM else self.fault_type
        delay = self.base_delay * (1 + 0.2 * rng.random())
        return kind, rank, delay


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _seconds(value: object) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    )


def _fault_type(value: object) -> FaultType:
    try:
        return FaultType(str(value).strip())
    except ValueError:
        allowed = ", ".join(t.value for t in FaultType)
        raise ValueError(f"simulated fault: type {value!r} is not one of {allowed}") from None


def _rank(value: str) -> int | None:
    if value in ("", RANDOM):
        return None
    try:
        rank = int(value)
    except ValueError:
        rank = -1
    if rank < 0:
        raise ValueError(f"simulated fault: rank {value!r} must be an integer >= 0, empty or 'random'")
    return rank


def _delay(value: str) -> float:
    try:
        delay = float(value)
    except ValueError:
        delay = math.nan
    if not math.isfinite(delay) or delay < 0:
        raise ValueError(f"simulated fault: delay {value!r} must be seconds >= 0")
    return delay


def _generation(value: str) -> int | None:
    if value in ("", ANY):
        return None
    try:
        generation = int(value)
    except ValueError:
        generation = -1
    if generation < 0:
        raise ValueError(f"simulated fault: generation {value!r} must be an integer >= 0, empty or 'any'")
    return generation


class SimulatedFaultThread(threading.Thread):
    """The daemon thread that waits, then breaks its process; ``cancel()`` disarms it."""

    def __init__(self, fault_type: FaultType, rank: int, delay: float) -> None:
        super().__init__(name="ft-simulated-fault", daemon=True)
        self.fault_type = fault_type
        self.rank = rank
        self.delay = delay
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def run(self) -> None:
        if self._cancelled.wait(self.delay):
            return
        banner = f"\n####\nFT: simulating fault: {self.fault_type} on rank {self.rank}\n####\n"
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.write(banner)
                stream.flush()
        match self.fault_type:
            case FaultType.RANK_HUNG:
                os.kill(os.getpid(), signal.SIGSTOP)
            case FaultType.RANK_KILLED:
                os.kill(os.getpid(), signal.SIGKILL)
            case _:
                main = threading.main_thread().ident
                if main is not None:
                    signal.pthread_kill(main, FAULT_SIGNAL)


def _install_handler(fault_type: FaultType, rank: int) -> None:
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            f"simulated fault {fault_type!s}: set it up from the main thread "
            "(it acts there through a signal handler)"
        )

    def handler(signum: int, frame: FrameType | None) -> None:
        if fault_type is FaultType.EXCEPTION:
            raise SimulatedFaultError(f"simulated fault: exception on rank {rank}")
        while True:  # the main thread is stuck here; other threads run on
            time.sleep(3600)

    signal.signal(FAULT_SIGNAL, handler)


def setup_simulated_fault(
    fault_type: FaultType | str | None = None,
    rank: int | str | None = None,
    base_delay: float | None = None,
    generation: int | str | None = None,
    *,
    seed: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> SimulatedFaultThread | None:
    """Arm a simulated fault on this rank if it is the one to fail; its thread, or None.

    With ``fault_type`` None the fault is ``FT_SIM_FAULT_DESC`` (none if unset or
    empty), and the other arguments given replace its fields. With a
    ``fault_type`` the environment is not read: ``base_delay`` is required,
    ``rank`` defaults to random and ``generation`` to every one. ``rank`` may
    be ``"random"``, ``generation`` ``"any"``. ``seed`` replaces the default
    ``<TORCHELASTIC_RUN_ID>:<generation>`` for the random choices. Raises
    ValueError for a bad description, RuntimeError when a ``sleep`` or
    ``exception`` fault for this rank is set up outside the main thread.
    """
    env = os.environ if environ is None else environ
    fault = _configured(fault_type, rank, base_delay, generation, env.get(ENV_FAULT, "").strip())
    if fault is None:
        return None
    current = int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)
    if not fault.applies_to(current):
        return None
    world_size = int(env.get("WORLD_SIZE") or 1)
    me = int(env.get("RANK") or 0)
    if seed is None:
        seed = f"{env.get('TORCHELASTIC_RUN_ID', '')}:{current}"
    kind, failing, delay = fault.resolve(world_size, seed)
    if failing != me:
        return None
    if kind in IN_MAIN_THREAD:
        _install_handler(kind, me)
    thread = SimulatedFaultThread(kind, me, delay)
    thread.start()
    return thread


def _configured(
    fault_type: FaultType | str | None,
    rank: int | str | None,
    base_delay: float | None,
    generation: int | str | None,
    desc: str,
) -> SimulatedFault | None:
    if fault_type is None:
        if not desc:
            return None
        fault = SimulatedFault.parse(desc)
    elif base_delay is None:
        raise ValueError("simulated fault: base_delay is required with an explicit fault_type")
    else:
        fault = SimulatedFault(_fault_type(fault_type), None, base_delay)
    if rank is not None:
        fault = replace(fault, rank=_rank(rank.strip()) if isinstance(rank, str) else rank)
    if base_delay is not None:
        fault = replace(fault, base_delay=base_delay)
    if generation is not None:
        fault = replace(
            fault,
            generation=_generation(generation.strip()) if isinstance(generation, str) else generation,
        )
    return fault
