"""When the next generation's standby ranks start: with the generation, or once it steps.

A standby imports what a rank imports while the generation it stands by for starts up.
Where the node's cores are busy with that start-up the two compete: on a 2-core machine,
standbys beside generation 0's start made its first step 1.3-1.9 s later, so there they
wait until every rank has stepped, and a fault in the first seconds restarts cold. A GPU
node has tens of idle cores while its ranks start: there standbys start with the
generation, and a fault in its first second restarts at the cost of a go.

The rule: a starting rank and its standby each want a core of their own; they start
together where the node's idle cores (this process's CPUs less their share of the load)
cover twice the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

WITH_GENERATION = "with_generation"
AFTER_STEPS = "after_steps"


@dataclass(frozen=True, slots=True)
class CpuRoom:
    """What the node's CPUs were doing when a generation launched."""

    cpus: int  # this process's CPUs (its affinity)
    online: int  # the node's CPUs
    load: float  # the node's load: tasks running or waiting for a CPU


@dataclass(frozen=True, slots=True)
class StandbyStart:
    when: str  # WITH_GENERATION or AFTER_STEPS
    idle_cores: float
    why: str


def idle_cores(room: CpuRoom) -> float:
    """This process's CPUs less their share of the node's load (spread evenly over the node)."""
    share = room.load * room.cpus / max(room.online, room.cpus, 1)
    return round(max(0.0, room.cpus - share), 2)


def standby_start(room: CpuRoom, ranks: int) -> StandbyStart:
    idle = idle_cores(room)
    wanted = 2 * ranks
    if ranks > 0 and idle >= wanted:
        why = f"{idle:g} idle cores cover {ranks} starting rank(s) and their standbys"
        return StandbyStart(WITH_GENERATION, idle, why)
    why = f"{idle:g} idle cores, {wanted} wanted for {ranks} starting rank(s) and their standbys"
    return StandbyStart(AFTER_STEPS, idle, why)
