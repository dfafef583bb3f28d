"""The catalogue of events: every event the daemon writes to its event log, typed.

One record class per event name, grouped by topic (``ranks``, ``generation``,
``checkpoints``, ``job``, ``health``, ``daemon``, ``services``). The emit sites build
records, the event log encodes them, the readers (classify, the run report, the
goodput ledger, the post-mortem, ``ft-supervisor events``) decode lines through the
same table, and ``scripts/gen_event_reference.py`` writes the operator's reference
from it: one list of names and fields for the code, the logs and the docs.

A line's shape: ``{"event": name, "t_wall", "t_mono", ["v": version,] common..., fields...}``.
``v`` is written only once an event is past its first version, so every line written
before versions existed reads as version 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from supervisor.core.catalogue import checkpoints, daemon, generation, health, job, ranks, services, snapshots
from supervisor.core.catalogue.base import HEADER, LEVEL_NAMES, VERSION_KEY, Event, Field, Unknown

__all__ = [
    "CATALOGUE", "COMMON", "LEVEL_NAMES", "TOPICS", "Event", "Field", "NotAnEvent", "Unknown",
    "decode", "envelope",
]  # fmt: skip

# the topics in the order the reference shows them, with their titles
TOPICS: dict[str, str] = {
    "ranks": "Ranks",
    "generation": "Generations and decisions",
    "checkpoints": "Checkpoints",
    "snapshots": "Snapshots held in memory",
    "job": "The job across nodes",
    "health": "Node health",
    "daemon": "The daemon",
    "services": "The daemon's services",
}
_MODULES: tuple[ModuleType, ...] = (ranks, generation, checkpoints, snapshots, job, health, daemon, services)

# fields the event log adds to every line of a run (EventLog's common fields)
COMMON = ("run_id",)


def _table(modules: tuple[ModuleType, ...]) -> dict[str, type[Event]]:
    table: dict[str, type[Event]] = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Event) and value.__module__ == module.__name__:
                if value.NAME in table:
                    raise TypeError(f"event {value.NAME!r} is catalogued twice")
                table[value.NAME] = value
    return table


CATALOGUE: Mapping[str, type[Event]] = _table(_MODULES)


class NotAnEvent(ValueError):
    """A line that is not an event: not JSON, not an object, or without an event name."""


def envelope(record: Event, t_wall: float, t_mono: float, common: Mapping[str, Any]) -> dict[str, Any]:
    """The line the event log writes for ``record`` (the key order is the format's)."""
    line: dict[str, Any] = {"event": record.NAME, "t_wall": t_wall, "t_mono": t_mono}
    if record.VERSION > 1:
        line[VERSION_KEY] = record.VERSION
    line.update(common)
    line.update(record.values())
    return line


def decode(
    data: bytes | str | Mapping[str, Any], table: Mapping[str, type[Event]] = CATALOGUE
) -> Event | Unknown:
    """The record of one event-log line (or of its parsed object).

    Unknown names come back as ``Unknown``, unknown fields as the record's ``extra``,
    a missing optional field reads its default, and a line of an older version has
    its renamed fields upgraded. Raises ``NotAnEvent`` for what is not an event."""
    if isinstance(data, bytes | str):
        import json  # noqa: PLC0415 (readers mostly pass parsed objects: the import is saved)

        try:
            data = json.loads(data)
        except ValueError as exc:
            raise NotAnEvent(f"not JSON: {exc}") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("event"), str):
        raise NotAnEvent("not an event (no event name)")
    name: str = data["event"]
    cls = table.get(name)
    if cls is None:
        head = {k: v for k, v in data.items() if k in HEADER or k in COMMON}
        fields = {k: v for k, v in data.items() if k != "event" and k not in head}
        return Unknown(name, fields, head)
    version = data.get(VERSION_KEY, 1)
    renames = _renames(cls, version if isinstance(version, int) else cls.VERSION)
    given: dict[str, Any] = {}
    head, extra = {}, {}
    for written, value in data.items():
        key = renames.get(written, written)
        if key in cls._NAMES:
            given[key] = value
        elif key in HEADER or key in COMMON:
            head[key] = value
        elif key not in ("event", VERSION_KEY):
            extra[key] = value
    record = cls.__new__(cls)
    record.__dict__.update(given)
    record.__dict__["_head"] = head
    if extra:
        record.__dict__["_extra"] = extra
    return record


def _renames(cls: type[Event], version: int) -> dict[str, str]:
    """Old field name -> current, composed over every version from ``version`` on."""
    out: dict[str, str] = {}
    for v in range(version, cls.VERSION):
        step = cls.RENAMED.get(v, {})
        # an earlier rename's target may be renamed again later: follow it through
        out = {old: step.get(new, new) for old, new in out.items()}
        for old, new in step.items():
            out.setdefault(old, new)
    return out
