"""The daemon's status, as data: what ``ft-supervisor status`` and SIGUSR1 show."""

from __future__ import annotations

import os
from typing import Any

from supervisor.config.run import RunConfig
from supervisor.coord.job import JobGeneration
from supervisor.core.catalogue.daemon import RunStarted, SettingsIgnored
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.launcher import Launcher
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.records.rundir import RunDir
from supervisor.runtime.services.loopwatch import LoopWatch
from supervisor.runtime.services.publisher import Publisher
from supervisor.transport.endpoints import Endpoints


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


def containment(gen: Generation | None) -> dict[str, Any] | None:
    """What holds the generation's processes: its cgroup, or the fallback and why."""
    if gen is None or not gen.ranks:
        return None
    return next(iter(gen.ranks.values())).containment.describe()


def timeouts(monitor: Monitor | None) -> dict[str, Any]:
    if monitor is None:
        return {}
    return monitor.learned.describe(monitor.configured)


def dropped(monitor: Monitor | None, control_drops: dict[str, int]) -> dict[str, int]:
    counts = {str(k): v for k, v in (monitor.drops.items() if monitor is not None else ())}
    for reason, n in control_drops.items():
        counts[f"control_{reason}"] = n
    return counts


def job(job_gen: JobGeneration | None, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """This node's place in a multi-node job, and every node's last published state."""
    return {
        "node_rank": None if job_gen is None else job_gen.node_rank,
        "nnodes": None if job_gen is None else job_gen.nnodes,
        "round": None if job_gen is None else job_gen.rdzv_round,
        "nodes": nodes,
    }


def build(
    *,
    run_id: str,
    run_dir: str,
    gen: Generation | None,
    monitor: Monitor,
    uptime: float,
    now: float,
    restarts_used: int,
    max_restarts: int,
    control_drops: dict[str, int],
    job: dict[str, Any] | None,
) -> dict[str, Any]:
    """What ``ft-supervisor status`` shows, and SIGUSR1 logs."""
    return {
        "run_id": run_id,
        "run_dir": run_dir,
        "pid": os.getpid(),
        "generation": None if gen is None else gen.number,
        "uptime_s": round(uptime, 3),
        "restarts_used": restarts_used,
        "max_restarts": max_restarts,
        "ranks": ranks(gen, monitor, now),
        "containment": containment(gen),
        "timeouts": timeouts(monitor),
        "received": monitor.received,
        "dropped": dropped(monitor, control_drops),
        "job": job,
    }


def daemon(
    out: dict[str, Any], *, publisher: Publisher, loop_watch: LoopWatch, launcher: Launcher,
    advice: dict[str, object], slow_lookups: list[dict[str, Any]], snapshots: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The ranks' status (``build``), and the daemon's own."""
    refused = {f"events_{k}": v for k, v in publisher.refused.items()}
    out["dropped"] = {**out.get("dropped", {}), **refused}
    lw = loop_watch
    # the daemon's own health: how late its loop ran, and for how long it was stalled
    out["loop"] = {"worst_lag": round(lw.worst_lag, 4), "stalls": len(lw.stalls),
                   "stalled_seconds": round(lw.stalled_total, 3)}  # fmt: skip
    out["standby"] = launcher.standby
    out["fork_server"] = launcher.fork_server
    out["checkpoint_interval"] = advice
    out["snapshots"] = snapshots  # held in memory: per rank the newest step, its age and size
    out["reverse_dns_slow"] = slow_lookups  # reverse DNS that would stall torch's stores
    return out


def run_started(cfg: RunConfig, rundir: RunDir, endpoints: Endpoints, monitor: Monitor) -> RunStarted:
    """The ``run_started`` event: the run's settings."""
    return RunStarted(
        run_dir=str(rundir.root),
        pid=os.getpid(),
        control=endpoints.control,
        nproc_per_node=cfg.topology.nproc_per_node,
        max_restarts=cfg.max_restarts,
        program=cfg.program.target,
        standby=cfg.standby,
        preload=",".join(cfg.program.preload) or None,
        timeouts=timeouts(monitor),
        # what `ft-supervisor classify` needs to decide again as this run decides
        policy=cfg.policy.policy.to_json(),
        restart_window=cfg.policy.restart_window,
    )


def announce_settings(cfg: RunConfig, events: EventLog) -> None:
    """Settings accepted so that command lines run unchanged, and ignored: once, each with why."""
    ignored = (*cfg.ft.ignored, *cfg.torchrun_ignored)
    if ignored:
        settings = [{"option": option, "why": why} for option, why in ignored]
        events.emit(SettingsIgnored(settings=settings))
