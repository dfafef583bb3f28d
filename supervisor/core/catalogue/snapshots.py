"""Events of the training state the daemon holds in memory for the ranks (``client.snapshot``)."""

from __future__ import annotations

from supervisor.core.catalogue.base import WARNING, Event


class SnapshotTaken(Event, name="snapshot_taken"):
    """A rank's snapshot is held complete (sampled: its first of a generation, then one a minute).

    Not every step: a rank that snapshots every step would fill the log."""

    generation: int | None
    rank: int
    step: int
    bytes: int
    seconds: float | None = None  # from the rank's begin to its done (copy and checksum)


class SnapshotRefused(Event, name="snapshot_refused", level=WARNING):
    """A rank's snapshot does not fit (--snapshot-memory, /dev/shm's space): training goes on.

    Told once per rank and reason; the rank's client is told why at every refusal."""

    generation: int | None
    rank: int
    bytes: int
    budget: int
    why: str


class SnapshotRestored(Event, name="snapshot_restored"):
    """A rank was told which held snapshot to restore (the newest step every rank holds)."""

    generation: int | None
    rank: int
    step: int
    source: str  # memory
    bytes: int


class SnapshotsReleased(Event, name="snapshots_released"):
    """The run ended: the snapshots' shared-memory files were removed."""

    bytes: int
    files: int
    directory: str | None = None
