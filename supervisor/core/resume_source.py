"""Where a restarted rank resumes: its snapshot held in memory or its checkpoint on disk.

Disk stays the record: when the whole job or the node's daemon died, nothing is held in
memory and the disk checkpoint is all there is. When both exist the newer step wins, since
resuming from the older one redoes the steps between them (and the memory snapshot, taken
every step or every few, is normally the newer). At the same step the one already in hand
wins: a disk checkpoint the framework has already read costs nothing more; otherwise the
memory snapshot, which is mapped, not read from storage. Pure: the adapters and
``supervisor.client.resume`` ask, and say the answer on the rank's stderr.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Source = Literal["memory", "disk", "none"]


@dataclass(frozen=True, slots=True)
class ResumeChoice:
    """The source to resume from, its step (None: from the beginning) and why, in words."""

    source: Source
    step: int | None
    why: str

    def line(self) -> str:
        """The one line a rank says about it."""
        if self.source == "none":
            return f"starting from the beginning: {self.why}"
        return f"resuming at step {self.step} from {self.source}: {self.why}"


def choose(memory_step: int | None, disk_step: int | None, *, disk_loaded: bool = False) -> ResumeChoice:
    """The newer of the memory snapshot (``memory_step``, None: none held) and the disk
    checkpoint (``disk_step``, None: none found); ``disk_loaded``: the disk checkpoint is
    already read (Lightning's ``ckpt_path``), which wins a tie."""
    if memory_step is None and disk_step is None:
        return ResumeChoice("none", None, "no snapshot held in memory and no disk checkpoint")
    if memory_step is None:
        assert disk_step is not None
        why = (f"no snapshot held in memory (none taken, or the daemon holding it is gone); "
               f"the disk checkpoint is at step {disk_step}")  # fmt: skip
        return ResumeChoice("disk", disk_step, why)
    if disk_step is None:
        return ResumeChoice("memory", memory_step, "no disk checkpoint; the snapshot held in memory")
    pair = f"memory snapshot at step {memory_step}, disk checkpoint at step {disk_step}"
    if memory_step != disk_step:
        newer: Source = "memory" if memory_step > disk_step else "disk"
        older = "disk checkpoint" if newer == "memory" else "memory snapshot"
        return ResumeChoice(newer, max(memory_step, disk_step), f"newer than the {older} ({pair})")
    if disk_loaded:
        return ResumeChoice(
            "disk", disk_step, f"the same step; the disk checkpoint is already loaded ({pair})"
        )
    return ResumeChoice(
        "memory", memory_step, f"the same step; memory is mapped, not read from disk ({pair})"
    )
