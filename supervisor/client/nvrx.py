"""nvidia-resiliency-ext's ``RankMonitorClient``, over the ft-supervisor client.

Code written for NVRx's fault-tolerance package runs under ft-supervisor
unchanged: in a rank the daemon started, ``import
nvidia_resiliency_ext.fault_tolerance`` (and its ``rank_monitor_client``) gives
this module's names (``supervisor.process.bootstrap`` resolves the import to
``supervisor.client._nvrx_package``; the rest of NVRx stays NVRx's own). Code
may also import it by our name::

    import supervisor.client.nvrx as fault_tolerance

    ft_client = fault_tolerance.RankMonitorClient()
    ft_client.init_workload_monitoring()
    ft_client.start_section("step"); ...; ft_client.end_section("step")
    ft_client.send_heartbeat()

What differs, on purpose:

* ``calculate_and_set_hb_timeouts`` and ``calculate_and_set_section_timeouts``
  keep NVRx's contract and meaning: the timeouts are calculated from what was
  observed so far (safety factor x the longest interval, merged with the value
  in force when the generation started), take effect at once, and from then on
  take precedence over the configuration; True when calculated, else False or
  ``RankMonitorClientError`` unless ``skip_if_not_ready``. The daemon calculates
  them, from every rank of the node (it sees every message: no collective runs
  in the training loop, where NVRx all-reduces the maxima over the whole job),
  and answers within 2 s. Learned timeouts in force are never below the daemon's
  floor (``--ft-learned-timeout-floor``, 10 s).
* A ``null`` timeout means what it means in NVRx: not enforced until it is
  calculated (for sections, the daemon also learns it at the end of each
  healthy generation; heartbeats only when the workload asks). A rank that
  sends heartbeats while no heartbeat timeout is in force gets the daemon's
  ``heartbeats_unmonitored`` warning.
* ``state_dict()`` is NVRx's ``{"current_timeouts": {"heartbeat": ...,
  "section": ...}}`` plus our own ``ft_supervisor_timeouts`` entry (NVRx ignores
  it), so the same JSON file serves either launcher. ``load_state_dict()``
  takes either form; values the daemon learned itself win over loaded ones,
  which fill in what it has not learned (a run moved to a node that has no
  state of its own). Only what this run monitors is applied (an old heartbeat
  timeout must not end ranks that send no heartbeats: the daemon never puts a
  deadline where none was configured); the rest is kept in ``state_dict()``.
* ``init_workload_monitoring(num_warmup_iters=)`` cannot change the daemon's
  warm-up (``--ft-num-warmup-iterations``); a different value is logged.
* ``send_workload_control_request`` waits (2 s at most) for the daemon's
  acknowledgement, as NVRx's waits for the launcher's reply, so a rank may exit
  right after it.
* ``cfg`` holds only the timeouts of NVRx's ``FaultToleranceConfig`` (those in
  force here): the rest configures NVRx's launcher, which is not running.
* No daemon (the script run by hand or under plain torchrun): every call is a
  no-op after the client's one warning, instead of NVRx's error.
* Calls before ``init_workload_monitoring`` raise ``RankMonitorClientError`` as
  in NVRx, except ``state_dict``, ``load_state_dict``,
  ``send_workload_control_request`` and ``restore``.
* Ours, beside NVRx's API: ``end_section("step", snapshot=(step, state))`` hands the
  state after the step to the daemon's memory (``client.snapshot``), and
  ``restore(disk_step)`` gives it back when it is newer than the disk checkpoint
  (``client.resume``; the choice is one line on stderr).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

from supervisor import client
from supervisor.client.nvrx_state import NVRX_KEY as NVRX_KEY  # noqa: PLC0414 - re-exported
from supervisor.client.nvrx_state import OURS_KEY as OURS_KEY  # noqa: PLC0414 - megatron's
from supervisor.client.nvrx_state import (
    apply_learned,
    as_mapping,
    learned_from_state,
    positive_seconds,
    to_nvrx_state,
)
from supervisor.client.nvrx_types import (
    ACTIONS,
    ClientConfig,
    HeartbeatTimeouts,
    SectionTimeouts,
    WorkloadAction,
    WorkloadControlRequest,
)
from supervisor.core.learning import Learned

__all__ = [
    "ClientConfig",
    "HeartbeatTimeouts",
    "RankMonitorClient",
    "RankMonitorClientError",
    "SectionTimeouts",
    "WorkloadAction",
    "WorkloadControlRequest",
    "apply_learned",
    "learned_from_state",
    "serve_as_nvrx",
    "to_nvrx_state",
]


class RankMonitorClientError(Exception):
    pass


class _Served:
    """Set when this module's names were imported as ``nvidia_resiliency_ext.fault_tolerance``."""

    as_nvrx = False
    version: str | None = None  # the rank's nvidia-resiliency-ext, from its package metadata
    told = False  # the daemon was told (once per process)


def serve_as_nvrx(version: str | None) -> None:
    """Called by ``supervisor.client._nvrx_package``: the daemon hears of it at the first
    ``init_workload_monitoring`` (its ``nvrx_served`` event)."""
    _Served.as_nvrx, _Served.version = True, version


class RankMonitorClient:
    """NVRx's ``RankMonitorClient`` API; one per rank process, like NVRx's."""

    CURRENT_TIMEOUTS_STATE_KEY = NVRX_KEY

    def __init__(self) -> None:
        self.is_initialized = False
        self.logger = logging.getLogger("RankMonitorClient")
        self._active = False
        self._fresh = Learned()  # what the daemon had learned when this rank started
        self._view: dict[str, Any] = {}  # our timeouts, as in force for this rank
        self._loaded: Learned | None = None  # loaded before init, sent at init
        self._heartbeats = 0
        self._open: set[str] = set()
        self._closed: set[str] = set()

    # -- life cycle --

    def init_workload_monitoring(self, num_warmup_iters: int | None = None) -> None:
        if self.is_initialized:
            raise RankMonitorClientError("RankMonitorClient is already initialized")
        self._active = client.init()
        if self._active and _Served.as_nvrx and not _Served.told:
            _Served.told = True
            client.nvrx_served(_Served.version)
        self._view = dict(client.state_dict()[OURS_KEY])
        self._fresh = Learned.from_json(self._view.get("learned"))
        self._heartbeats = 0
        self._open, self._closed = set(), set()
        self.is_initialized = True
        warmup = self._view.get("warmup_iterations")
        if self._active and num_warmup_iters is not None and num_warmup_iters != warmup:
            self.logger.warning(
                "num_warmup_iters=%s is not used: ft-supervisor applies its own warm-up "
                "(--ft-num-warmup-iterations, %s here)",
                num_warmup_iters,
                warmup,
            )
        if self._loaded is not None:
            self._send_loaded(self._loaded)

    def shutdown_workload_monitoring(self) -> None:
        if self.is_initialized:
            client.shutdown()
            self.is_initialized = False

    def _ensure_is_ready(self) -> None:
        if not self.is_initialized:
            raise RankMonitorClientError("RankMonitorClient is not initialized")

    # -- signs of life --

    def send_heartbeat(self) -> None:
        self._ensure_is_ready()
        client.heartbeat()
        self._heartbeats += 1

    def start_section(self, section: str) -> None:
        self._ensure_is_ready()
        client.start_section(section)
        self._open.add(section)

    def end_section(self, section: str, *, snapshot: tuple[int, Mapping[str, Any]] | None = None) -> None:
        """NVRx's; ours: ``snapshot=(step, state)``, the state after the section (a step)
        handed to the daemon's memory, to be given back by ``restore``."""
        self._ensure_is_ready()
        client.end_section(section)
        if section in self._open:
            self._open.discard(section)
            self._closed.add(section)
        if snapshot is not None:
            step, state = snapshot
            client.snapshot(state, step)

    def restore(
        self, disk_step: int | None = None, *, disk_loaded: bool = False
    ) -> tuple[int, dict[str, Any]] | None:
        """Ours: ``(step, state)`` of the memory snapshot when it is newer than the disk
        checkpoint at ``disk_step`` (None: there is none; ``disk_loaded``: already loaded, it
        wins a tie), else None. The choice is one line on stderr."""
        resumed = client.resume(disk_step, disk_loaded=disk_loaded)
        if resumed.state is None or resumed.choice.step is None:
            return None
        return resumed.choice.step, resumed.state

    def end_all_sections(self) -> None:
        self._ensure_is_ready()
        client.end_all_sections()
        self._closed |= self._open
        self._open = set()

    # -- timeouts --

    @property
    def cfg(self) -> ClientConfig | None:
        """The configured timeouts (NVRx's ``cfg``: None before ``init_workload_monitoring``)."""
        if not self.is_initialized:
            return None
        raw = self._view.get("sections")
        return ClientConfig(
            initial_rank_heartbeat_timeout=positive_seconds(self._view.get("initial_heartbeat")),
            rank_heartbeat_timeout=positive_seconds(self._view.get("heartbeat")),
            rank_section_timeouts={str(k): positive_seconds(v) for k, v in as_mapping(raw).items()},
            rank_out_of_section_timeout=positive_seconds(self._view.get("out_of_section")),
        )

    @property
    def hb_timeouts(self) -> HeartbeatTimeouts | None:
        if not self.is_initialized:
            return None
        learned = self._view.get("learned") or {}
        return HeartbeatTimeouts(
            initial=positive_seconds(self._view.get("initial_heartbeat")),
            subsequent=positive_seconds(self._view.get("heartbeat")),
            were_calculated=learned.get("initial_heartbeat") is not None
            or learned.get("heartbeat") is not None,
        )

    @property
    def section_timeouts(self) -> SectionTimeouts | None:
        if not self.is_initialized:
            return None
        learned = self._view.get("learned") or {}
        raw = self._view.get("sections")
        sections = {str(k): positive_seconds(v) for k, v in as_mapping(raw).items()}
        return SectionTimeouts(
            section=sections,
            out_of_section=positive_seconds(self._view.get("out_of_section")),
            calculated_sections={k for k in learned.get("sections") or {} if k in sections},
            is_out_of_section_calculated=learned.get("out_of_section") is not None,
        )

    def _monitored(self) -> set[str]:
        raw = self._view.get("sections")
        return set(raw) if isinstance(raw, Mapping) else set()

    def calculate_and_set_hb_timeouts(self, skip_if_not_ready: bool = False) -> bool:
        """Calculate the heartbeat timeouts now and put them in force (NVRx's contract).

        Ready once this rank sent two heartbeats and the daemon saw enough.
        """
        self._ensure_is_ready()
        ready = self._active and self._heartbeats >= 2 and self._calculate(heartbeat=True)
        return self._ready(ready, skip_if_not_ready)

    def calculate_and_set_section_timeouts(
        self,
        selected_sections: Collection[str] | None = None,
        calc_out_of_section: bool = True,
        skip_if_not_ready: bool = False,
    ) -> bool:
        """Calculate section (and out-of-section) timeouts now and put them in force.

        Ready once every selected monitored section was completed here and the daemon
        saw enough. A selected section the daemon does not monitor is never ready.
        """
        self._ensure_is_ready()
        # NVRx's None is every section; an empty list is none (the out-of-section timeout only)
        every = selected_sections is None
        selected = self._monitored() if every else set(selected_sections or ())
        ready = self._active and selected <= (self._closed & self._monitored())
        if ready and (selected or calc_out_of_section):
            ready = self._calculate(
                sections=None if every else sorted(selected),
                all_sections=every,
                out_of_section=calc_out_of_section,
            )
        return self._ready(ready, skip_if_not_ready)

    def _calculate(self, **ask: Any) -> bool:
        answer = client.calculate_timeouts(**ask)
        self._view = dict(client.state_dict()[OURS_KEY])
        return answer is True

    def _ready(self, ready: bool, skip_if_not_ready: bool) -> bool:
        if ready:
            return True
        if not self._active or skip_if_not_ready:
            return False  # no daemon: nothing to learn, and nothing to fail training for
        raise RankMonitorClientError("Not enough data to compute timeouts.")

    # -- state --

    def state_dict(self) -> dict[str, Any]:
        """NVRx's form, and ours beside it; the same on every rank."""
        if self.is_initialized:
            view = self._view
        else:  # NVRx would fail here; what a load before init will bring is the best answer
            view = {"learned": self._loaded.to_json()} if self._loaded is not None else {}
        state = to_nvrx_state(view)
        if view:
            state[OURS_KEY] = dict(view)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """A state from ``state_dict``, ours or NVRx's; before or after ``init_workload_monitoring``."""
        loaded = learned_from_state(state)
        if loaded is None:
            return
        if self.is_initialized:
            self._send_loaded(loaded)
        else:
            self._loaded = loaded

    def _send_loaded(self, loaded: Learned) -> None:
        self._loaded = None
        if loaded == Learned():
            return
        # as the daemon merges it: what it learned itself wins, the loaded state fills gaps
        merged = self._fresh.filled_from(loaded)
        # kept even without a daemon: a script run by hand then saves what it loaded
        self._view = apply_learned(self._view, merged)
        if self._active and merged != self._fresh:
            client.load_state_dict({OURS_KEY: {"learned": loaded.to_json()}})

    # -- workload control --

    def send_workload_control_request(self, req: WorkloadControlRequest) -> None:
        """Ask the daemon for an outcome: continue, exclude this node, or shut the workload down."""
        name = getattr(getattr(req, "action", None), "name", None)
        action = ACTIONS.get(name) if isinstance(name, str) else None
        if action is None:
            raise RankMonitorClientError(f"not a WorkloadControlRequest with a WorkloadAction: {req!r}")
        client.request(action, str(req.description))
