"""Events of the node's health: the ledger of marks, quarantine, the kernel log."""

from __future__ import annotations

from supervisor.core.catalogue.base import ERROR, WARNING, Event


class NodeHealthUnreadable(Event, name="node_health_unreadable", level=WARNING):
    """The node health ledger could not be read: it starts empty."""

    problem: str


class NodeHealthUnwritable(Event, name="node_health_unwritable", level=WARNING):
    """The node health ledger could not be written."""

    path: str
    error: str


class NodeHealthMarked(Event, name="node_health_marked", level=WARNING):
    """A failure that points at the node (not the job) was marked in its ledger."""

    generation: int
    kind: str
    rule: str | None
    marks: int
    path: str


class NodeQuarantined(Event, name="node_quarantined", level=ERROR):
    """The node is quarantined: the quarantine file was written and the job leaves it."""

    when: str
    quarantine: str
    ledger: str
    detail: str
    pid: int


class KernelLogUnavailable(Event, name="kernel_log_unavailable"):
    """The kernel log cannot be read: Xid and OOM lines go unseen."""

    path: str
    error: str
