"""The daemon's status, as data: what ``ft-supervisor status`` and SIGUSR1 show."""

from __future__ import annotations

from typing import Any

from supervisor.runtime.generation import Generation
from supervisor.runtime.monitor import Monitor


def _age(now: float, then: float | None) -> float | None:
    return None if then is None else round(now - then, 3)


def ranks(gen: Generation | None, monitor: Monitor | None, now: float) -> list[dict[str, Any]]:
    if gen is None:
        return []
    out = []
    for local_rank, r in sorted(gen.ranks.items()):
        row: dict[str, Any] = {
            "rank": r.slot.rank,
            "local_rank": local_rank,
            "pid": r.pid,
            "state": str(r.state),
        }
        watch = monitor.watches.get(r.slot.rank) if monitor is not None else None
        if watch is not None:
            row.update(
                iteration=watch.iteration,
                sections={name: _age(now, opened) for name, opened in watch.open_sections.items()},
                heartbeat_age=_age(now, watch.last_heartbeat),
                connected=True,
            )
        out.append(row)
    return out


def timeouts(monitor: Monitor | None) -> dict[str, Any]:
    if monitor is None:
        return {}
    return monitor.learned.describe(monitor.configured)


def dropped(monitor: Monitor | None, control_drops: dict[str, int]) -> dict[str, int]:
    counts = {str(k): v for k, v in (monitor.drops.items() if monitor is not None else ())}
    for reason, n in control_drops.items():
        counts[f"control_{reason}"] = n
    return counts
