"""Events of the daemon's services: control socket, metrics, sd_notify, loop watch, DNS."""

from __future__ import annotations

from typing import Any

from supervisor.core.catalogue.base import DEBUG, ERROR, WARNING, Event


class ControlDropped(Event, name="control_dropped", level=WARNING):
    """A control request was refused (malformed, unauthorised, too many)."""

    reason: str
    detail: str | None


class ControlFailed(Event, name="control_failed", level=ERROR):
    """Handling a control command raised (a bug): the caller got an error."""

    command: str
    error: str


class MetricsServing(Event, name="metrics_serving"):
    """The Prometheus metrics endpoint is serving."""

    addr: str
    port: int
    url: str


class MetricsUnavailable(Event, name="metrics_unavailable", level=WARNING):
    """The metrics endpoint could not be opened."""

    addr: str
    port: int
    error: str


class MetricsFailed(Event, name="metrics_failed", level=WARNING):
    """Serving a metrics scrape failed."""

    error: str


class NotifyFailed(Event, name="notify_failed", level=WARNING):
    """A systemd notification (sd_notify) could not be sent."""

    address: str
    error: str | None


class DaemonStalled(Event, name="daemon_stalled", level=WARNING):
    """The daemon's event loop was stalled: the time is not charged to the ranks' deadlines."""

    seconds: float
    detail: str


class ReverseDnsSlow(Event, name="reverse_dns_slow", level=WARNING):
    """A reverse DNS lookup of a job address is slow: NCCL and gloo will stall on it."""

    address: str
    seconds: float
    outcome: str
    fix: str


class ReverseDnsChecked(Event, name="reverse_dns_checked", level=DEBUG):
    """The reverse DNS lookups of the job's addresses, timed."""

    lookups: list[dict[str, Any]]
