"""Resume a restarted rank from the newer of its memory snapshot and its disk checkpoint.

    latest = find_my_checkpoint()                      # your own: its step, or None
    r = client.resume(disk_step=latest.step if latest else None)
    if r.choice.source == "memory":
        model.load_state_dict(r.state["model"]); step = r.choice.step
    elif r.choice.source == "disk":
        load(latest); step = latest.step

``client.restore()`` gives the memory snapshot alone; this asks for it and decides with
``supervisor.core.resume_source.choose`` (the newer step wins; disk stays the record when
nothing is held in memory), and says the choice in one line on the rank's stderr. The
Lightning callback and the Megatron-style hooks call it; so can a plain loop.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from supervisor.client import snapshots
from supervisor.core.resume_source import ResumeChoice, choose

__all__ = ["ResumeChoice", "Resumed", "resume"]


@dataclass(frozen=True, slots=True)
class Resumed:
    """The choice, and the memory snapshot's state when it is the one chosen (else None)."""

    choice: ResumeChoice
    state: dict[str, Any] | None


def resume(
    disk_step: int | None = None, *, disk_loaded: bool = False, timeout: float = snapshots.RESTORE_TIMEOUT
) -> Resumed:
    """Ask the daemon for the memory snapshot (``client.restore()``) and choose between it and
    the disk checkpoint at ``disk_step`` (None: there is none); ``disk_loaded``: that
    checkpoint is already read, so it wins a tie. Says the choice on stderr, once per call."""
    held = snapshots.restore(timeout=timeout)
    choice = choose(None if held is None else held[0], disk_step, disk_loaded=disk_loaded)
    sys.stderr.write(f"supervisor.client: {choice.line()}\n")
    sys.stderr.flush()
    snapshots.tell("resumed", source=choice.source, step=choice.step, why=choice.why[:400])  # the event
    return Resumed(choice, held[1] if held is not None and choice.source == "memory" else None)
