"""Reading a run's event logs: one daemon run, or every daemon run of a run id.

``<log-dir>/<run id>/<UTC stamp>-<host>-<pid>/events.jsonl`` is one daemon run.
A run id's directory holds one per node, and more when the run was resumed
(rescheduled, resubmitted). Daemon runs whose time spans overlap are the nodes of
one *session* and are merged by time, since generation numbers are job-wide;
sessions that follow each other are accounted one by one (their generation
numbers start again at 0) and the gaps between them are downtime.

A line that is not a JSON object with an ``event`` name (a daemon killed
mid-write leaves a truncated last line) is skipped and counted, never fatal.
The others go through the event catalogue: an older daemon's line reads with
today's field names, and an optional field it left out reads as its default.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from supervisor.config.errors import ConfigError
from supervisor.core.catalogue import decode
from supervisor.core.catalogue.daemon import RunFinished, RunStarted

EVENTS = "events.jsonl"


@dataclass(frozen=True, slots=True)
class Skipped:
    path: Path
    line: int  # 1-based
    why: str


@dataclass(slots=True)
class DaemonRun:
    path: Path  # the daemon run's directory
    events: list[dict[str, Any]]
    skipped: list[Skipped]

    @property
    def host(self) -> str:
        parts = self.path.name.split("-")  # <stamp>-<host>-<pid>; a host may hold dashes
        return "-".join(parts[1:-1]) if len(parts) >= 3 else self.path.name

    @property
    def pid(self) -> int | None:
        started = next((e for e in self.events if e["event"] == RunStarted.NAME), None)
        pid = None if started is None else started.get("pid")
        return pid if isinstance(pid, int) else None

    @property
    def start(self) -> float:
        return float(self.events[0]["t_wall"]) if self.events else 0.0

    @property
    def end(self) -> float:
        return float(self.events[-1]["t_wall"]) if self.events else 0.0

    @property
    def finished(self) -> bool:
        return any(e["event"] == RunFinished.NAME for e in self.events)


@dataclass(slots=True)
class Session:
    """Daemon runs that overlap in time: the nodes of one job, merged by time."""

    runs: list[DaemonRun] = field(default_factory=list)

    @property
    def events(self) -> list[dict[str, Any]]:
        merged = [e for run in self.runs for e in run.events]
        merged.sort(key=lambda e: float(e["t_wall"]))  # stable: one node's order is kept
        return merged

    @property
    def start(self) -> float:
        return min(r.start for r in self.runs)

    @property
    def end(self) -> float:
        return max(r.end for r in self.runs)


def parse_lines(lines: Iterable[bytes], path: Path) -> tuple[list[dict[str, Any]], list[Skipped]]:
    """The events of an event log, and the lines that are not events."""
    events: list[dict[str, Any]] = []
    skipped: list[Skipped] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            why = "truncated" if not line.rstrip().endswith(b"}") else "not JSON"
            skipped.append(Skipped(path, number, why))
            continue
        if (
            not isinstance(event, dict)
            or not isinstance(event.get("event"), str)
            or not isinstance(event.get("t_wall"), int | float)
            or isinstance(event.get("t_wall"), bool)
        ):
            skipped.append(Skipped(path, number, "not an event (no event name or t_wall)"))
            continue
        events.append(decode(event).as_dict())
    return events, skipped


def read_daemon_run(path: Path) -> DaemonRun:
    events_path = path / EVENTS
    try:
        data = events_path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {events_path}: {exc.strerror or exc}") from None
    events, skipped = parse_lines(data.split(b"\n"), events_path)
    return DaemonRun(path, events, skipped)


def find_daemon_runs(root: Path) -> list[Path]:
    """The daemon run directories ``root`` names: itself, its children, or the children
    of its one run id (a log directory with a single run)."""
    if not root.exists():
        raise ConfigError(f"no such directory: {root}")
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory: give a run directory (it holds {EVENTS})")
    if (root / EVENTS).is_file():
        return [root]
    runs = sorted(p.parent for p in root.glob(f"*/{EVENTS}"))
    if runs:
        return runs
    run_ids = sorted({p.parent.parent for p in root.glob(f"*/*/{EVENTS}")})
    if len(run_ids) == 1:
        return sorted(p.parent for p in run_ids[0].glob(f"*/{EVENTS}"))
    if run_ids:
        names = ", ".join(p.name for p in run_ids)
        raise ConfigError(f"{root} holds several runs ({names}): name one of their directories")
    raise ConfigError(f"no {EVENTS} in {root} or in its daemon runs: is it a run directory?")


def sessions(runs: list[DaemonRun]) -> list[Session]:
    """Group daemon runs that overlap in time; sessions in time order."""
    out: list[Session] = []
    for run in sorted((r for r in runs if r.events), key=lambda r: r.start):
        if out and run.start <= out[-1].end:
            out[-1].runs.append(run)
        else:
            out.append(Session([run]))
    return out


def read(root: Path) -> tuple[list[DaemonRun], list[Session]]:
    runs = [read_daemon_run(p) for p in find_daemon_runs(root)]
    found = sessions(runs)
    if not found:
        where = ", ".join(str(r.path / EVENTS) for r in runs)
        raise ConfigError(f"no events in {where}")
    return runs, found
