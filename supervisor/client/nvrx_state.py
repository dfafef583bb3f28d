"""NVRx's saved timeouts state and ours, one from the other (pure functions).

NVRx saves ``{"current_timeouts": {"heartbeat": ..., "section": ...}}``; ft-supervisor
saves ``{"ft_supervisor_timeouts": ...}`` (``client.state_dict()``). The shim
(``supervisor.client.nvrx``) writes both and reads either: ``to_nvrx_state``,
``learned_from_state``, ``apply_learned``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from supervisor.core.learning import Learned

NVRX_KEY = "current_timeouts"
OURS_KEY = "ft_supervisor_timeouts"


def as_mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def positive_seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def to_nvrx_state(timeouts: Mapping[str, Any]) -> dict[str, Any]:
    """NVRx's state (``{"current_timeouts": ...}``) from ours (``client.state_dict()[OURS_KEY]``).

    As NVRx does, only what was calculated (learned) is there: ``heartbeat`` when
    either heartbeat timeout was learned, ``section`` when a section or the
    out-of-section timeout was. Values are those in force.
    """
    learned = Learned.from_json(timeouts.get("learned"))
    current: dict[str, Any] = {}
    if learned.initial_heartbeat is not None or learned.heartbeat is not None:
        current["heartbeat"] = {
            "initial": positive_seconds(timeouts.get("initial_heartbeat")) or learned.initial_heartbeat,
            "subsequent": positive_seconds(timeouts.get("heartbeat")) or learned.heartbeat,
            "were_calculated": True,
        }
    in_force = {str(k): positive_seconds(v) for k, v in as_mapping(timeouts.get("sections")).items()}
    in_force.update({k: v for k, v in learned.sections.items() if k not in in_force})
    if learned.sections or learned.out_of_section is not None:
        current["section"] = {
            "section": in_force,
            "out_of_section": positive_seconds(timeouts.get("out_of_section")) or learned.out_of_section,
            "calculated_sections": sorted(learned.sections),
            "is_out_of_section_calculated": learned.out_of_section is not None,
        }
    return {NVRX_KEY: current}


def _from_nvrx(current: Mapping[str, Any]) -> Learned:
    """NVRx's calculated timeouts, which take precedence over the configuration there too."""
    hb = current.get("heartbeat")
    initial = heartbeat = None
    if isinstance(hb, Mapping) and hb.get("were_calculated"):
        initial, heartbeat = positive_seconds(hb.get("initial")), positive_seconds(hb.get("subsequent"))
    sec = current.get("section")
    sections: dict[str, float] = {}
    out_of_section = None
    if isinstance(sec, Mapping):
        values = as_mapping(sec.get("section"))
        calculated = sec.get("calculated_sections")
        for name in calculated if isinstance(calculated, list | tuple | set | frozenset) else ():
            seconds = positive_seconds(values.get(name))
            if seconds is not None:
                sections[str(name)] = seconds
        if sec.get("is_out_of_section_calculated"):
            out_of_section = positive_seconds(sec.get("out_of_section"))
    learned = Learned(initial, heartbeat, sections, out_of_section)
    return Learned(initial, heartbeat, sections, out_of_section, frozenset(learned.keys()))


def learned_from_state(state: object) -> Learned | None:
    """Learned timeouts from a saved state: ours, or NVRx's; None if neither.

    Ours is exact and preferred when both are there. Anything malformed inside
    is skipped, never raised: a state file is input from an earlier run.
    """
    if not isinstance(state, Mapping):
        return None
    ours = state.get(OURS_KEY)
    if isinstance(ours, Mapping):
        return Learned.from_json(ours.get("learned"))
    nvrx = state.get(NVRX_KEY)
    if isinstance(nvrx, Mapping):
        return _from_nvrx(nvrx)
    return None


def apply_learned(timeouts: Mapping[str, Any], learned: Learned) -> dict[str, Any]:
    """Our timeouts view with ``learned`` in force where the view monitors something
    (as the daemon applies it); all of it kept as learned."""
    view = dict(timeouts)
    for key, value in (
        ("initial_heartbeat", learned.initial_heartbeat),
        ("heartbeat", learned.heartbeat),
        ("out_of_section", learned.out_of_section),
    ):
        if value is not None and view.get(key) is not None:
            view[key] = value
    sections = dict(as_mapping(timeouts.get("sections")))
    view["sections"] = {k: learned.sections.get(k, v) for k, v in sections.items()}
    view["learned"] = learned.to_json()
    return view
