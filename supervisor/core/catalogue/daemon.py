"""Events of the daemon itself: its run, its state, operators' commands, what it leaves."""

from __future__ import annotations

from typing import Any

from supervisor.core.catalogue.base import ERROR, WARNING, Event


class RunStarted(Event, name="run_started"):
    """The daemon started: its run directory, control socket, program and settings."""

    run_dir: str
    pid: int
    control: str
    nproc_per_node: int
    max_restarts: int
    program: str
    standby: bool
    preload: str | None
    timeouts: dict[str, Any]
    policy: dict[str, Any]
    restart_window: float | None


class RunFinished(Event, name="run_finished"):
    """The daemon finished: its exit code, the restarts used and its own cost."""

    exit_code: int
    restarts_used: int
    seconds: float
    daemon_max_rss_kb: int
    daemon_cpu_s: float
    run_dir: str


class Status(Event, name="status"):
    """A snapshot of the daemon's state (on SIGUSR1): what ``ft-supervisor status`` shows."""

    run_id: str
    run_dir: str
    pid: int
    generation: int | None
    uptime_s: float
    restarts_used: int
    max_restarts: int
    ranks: list[dict[str, Any]]
    containment: dict[str, Any] | None
    timeouts: dict[str, Any]
    received: dict[str, Any]
    dropped: dict[str, Any]
    job: dict[str, Any] | None
    loop: dict[str, Any]
    standby: dict[str, Any] | None
    fork_server: dict[str, Any] | None
    checkpoint_interval: dict[str, Any]
    reverse_dns_slow: list[dict[str, Any]] | None
    snapshots: dict[str, Any] | None = None  # held in memory: per rank the newest step, age, bytes


class StopRequested(Event, name="stop_requested"):
    """A signal asked the daemon to stop: the ranks are stopped, then it exits."""

    signal: str


class StopForced(Event, name="stop_forced"):
    """A second signal forced the stop: no more waiting for the ranks' saves."""

    signal: str


class SettingsIgnored(Event, name="settings_ignored", level=WARNING):
    """Options given that have no effect here, and why."""

    settings: list[dict[str, str]]


class StateUnreadable(Event, name="state_unreadable", level=WARNING):
    """The daemon's state file from an earlier run could not be read."""

    problem: str


class StateUnwritable(Event, name="state_unwritable", level=WARNING):
    """The daemon's state file could not be written."""

    path: str
    error: str


class ReloadRequested(Event, name="reload_requested"):
    """A reload of the configuration file was asked (SIGHUP)."""

    path: str


class ReloadFailed(Event, name="reload_failed", level=WARNING):
    """The configuration file could not be reloaded: the settings in force stay."""

    path: str
    error: str


class ConfigReloaded(Event, name="config_reloaded"):
    """The configuration file was reloaded: what changed, what needs a restart."""

    path: str
    changed: dict[str, Any] | None
    not_applied: list[str] | None
    timeouts: dict[str, Any]


class Hosting(Event, name="hosting"):
    """How the daemon is hosted: PID 1, subreaper, systemd notify, forwarded signals."""

    pid1: bool
    subreaper: bool
    notify: bool
    watchdog_interval: float | None
    reload_file: str | None
    forward_signals: list[str] | None


class SignalForwarded(Event, name="signal_forwarded"):
    """A signal the daemon received was forwarded to the ranks."""

    signal: str
    generation: int | None
    ranks: list[int]


class OrphanReaped(Event, name="orphan_reaped"):
    """An orphaned process (not a rank) was reaped by the daemon as PID 1 or subreaper."""

    pid: int
    status: int
    signal: str | None


class FinishedFlagWritten(Event, name="finished_flag_written"):
    """The finished flag was written: the job completed."""

    path: str


class FinishedFlagUnwritable(Event, name="finished_flag_unwritable", level=ERROR):
    """The finished flag could not be written."""

    path: str
    error: str


class ReasonWritten(Event, name="reason_written"):
    """The reason file (why the daemon exited) was written."""

    path: str
    outcome: str
    rule: str | None


class ReasonUnwritable(Event, name="reason_unwritable", level=WARNING):
    """The reason file could not be written."""

    path: str
    error: str


class EventLogRestored(Event, name="event_log_restored", level=WARNING):
    """The event log takes lines again after it was degraded; ``lost`` lines were dropped."""

    lost: int
    error: str | None = None  # the console's line only: why it had been degraded


class EventLogDegraded(Event, name="event_log_degraded", level=ERROR):
    """The event log file cannot be written (console and events socket only): lines are kept."""

    path: str
    error: str
    keeping: str


class ListenerFailed(Event, name="listener_failed", level=WARNING):
    """An in-process reader of events (metrics, sd_notify) raised: it is dropped (console only)."""

    event: str
    error: str
