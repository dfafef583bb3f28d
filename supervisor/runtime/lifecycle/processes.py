"""How the daemon acts on the node's processes: the seam between the loop and the OS.

In production ranks are started through the bootstrap (``process.spawn``; the fork
server, where one serves, is the launcher's), their process groups are signalled,
a sentinel process outlives the daemon to end what it leaves behind, and the
daemon adopts orphans (subreaper). The runtime's fast tests pass fake ranks
instead: the loop, the monitor and every decision run as they do in production.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from supervisor.core.program import Program
from supervisor.core.standby_start import CpuRoom
from supervisor.core.topology import RankSlot
from supervisor.process.cgroups import Containment
from supervisor.process.orphans import OrphanGuard
from supervisor.process.spawn import RankFiles, RankProcess, spawn_rank
from supervisor.process.terminate import Signaller

__all__ = ["Guard", "Processes", "Spawn", "cpu_room", "spawn_rank"]


class Spawn(Protocol):
    async def __call__(
        self, program: Program, slot: RankSlot, env: Mapping[str, str], files: RankFiles, *, now: float,
        standby: bool, containment: Containment,
    ) -> RankProcess: ...  # fmt: skip


class Guard(Protocol):
    """What ends the run's processes should the daemon die (``process.orphans``)."""

    @property
    def pid(self) -> int: ...
    async def close(self, timeout: float = 5.0) -> None: ...


async def _sentinel(run_entry: bytes) -> Guard:
    return await OrphanGuard.start(run_entry)


def cpu_room() -> CpuRoom:
    """This process's CPUs and the node's load: the 1-minute average, or the tasks
    runnable now (less the one reading) where more: a start-up's load is seconds old."""
    load = os.getloadavg()[0]
    try:
        runnable = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1
    except (OSError, ValueError, IndexError):
        runnable = 0
    return CpuRoom(len(os.sched_getaffinity(0)), os.cpu_count() or 1, max(load, float(runnable)))


@dataclass(frozen=True, slots=True)
class Processes:
    spawn: Spawn = spawn_rank
    signaller: Signaller = field(default_factory=Signaller)
    guard: Callable[[bytes], Awaitable[Guard]] = _sentinel
    adopt_orphans: bool = True  # become the subreaper of the ranks' descendants, and reap orphans
    cpu_room: Callable[[], CpuRoom] = cpu_room  # when standbys may start with their generation
