"""What the ranks' messages reveal once per run, and the daemon says once."""

from __future__ import annotations

from supervisor.core.catalogue.ranks import HeartbeatsUnmonitored, NvrxServed
from supervisor.core.watch import Timeouts
from supervisor.runtime.records.events import EventLog
from supervisor.transport import schema


class Notices:
    def __init__(self, events: EventLog) -> None:
        self._events = events
        self._told_unmonitored = False
        self._nvrx_served = False  # told once per run, by the first rank that uses it

    def unmonitored(self, generation: int | None, rank: int, t: Timeouts) -> None:
        """Heartbeats nobody holds the rank to: say so once, a hang would go unnoticed.

        Not where sections or the out-of-section time hold it (Lightning's callback sends
        both): the heartbeats are then merely unused, and a hang is still caught.
        """
        if t.heartbeat is not None or t.sections or t.out_of_section is not None or self._told_unmonitored:
            return
        self._told_unmonitored = True
        self._events.emit(HeartbeatsUnmonitored(
            generation=generation, rank=rank,
            detail="heartbeats arrive but no heartbeat timeout is in force: set --ft-rank-heartbeat-timeout, "
            "or have the workload calculate it (calculate_and_set_hb_timeouts)",
        ))  # fmt: skip

    def nvrx(self, generation: int | None, m: schema.NvrxServed) -> None:
        """Which NVRx the ranks' unchanged code was written against, once: its client is ours."""
        if self._nvrx_served:
            return
        self._nvrx_served = True
        self._events.emit(NvrxServed(
            generation=generation, rank=m.rank, version=m.version,
            detail="nvidia_resiliency_ext.fault_tolerance is served by ft-supervisor's client "
            "(supervisor.client.nvrx); the rest of nvidia-resiliency-ext is its own",
        ))  # fmt: skip
