"""Events of checkpoints: the ranks' saves, the advised interval, the sync to storage."""

from __future__ import annotations

from supervisor.core.catalogue.base import DEBUG, WARNING, Event


class CheckpointReported(Event, name="checkpoint_reported", level=DEBUG):
    """A rank reported a checkpoint save (started or finished)."""

    generation: int | None
    rank: int
    checkpoint: str
    iteration: int | None


class SaveRequested(Event, name="save_requested"):
    """The ranks were asked to save a checkpoint before they are stopped."""

    generation: int
    ranks: list[int]
    deadline: float
    why: str


class SaveFinished(Event, name="save_finished"):
    """The ranks' last saves: who saved, who failed, who did not answer by the deadline."""

    generation: int
    saved: list[int]
    failed: dict[str, str] | None
    unanswered: list[int] | None
    seconds: float


class CheckpointIntervalAdvised(Event, name="checkpoint_interval_advised"):
    """The advised checkpoint interval changed (Young/Daly, from measured saves and failures)."""

    seconds: float | None
    ts: float | None
    tf: float | None
    tr: float | None
    saves: int
    failures: int
    recoveries: int
    trained: float
    prior: float | None
    why: str
    covered: int = 0  # failures restored from memory snapshots: not counted in tf


class CheckpointSyncFailed(Event, name="checkpoint_sync_failed", level=WARNING):
    """Copying checkpoints to or from remote storage failed (phase: restore, sync, final)."""

    phase: str
    error: str
    dest: str


class CheckpointRestoreSkipped(Event, name="checkpoint_restore_skipped"):
    """No checkpoint was restored from remote storage, and why."""

    reason: str
    dest: str
    local: list[str] | None


class CheckpointRestored(Event, name="checkpoint_restored"):
    """A checkpoint was restored from remote storage."""

    entry: str
    files: int
    bytes: int
    seconds: float
    source: str


class CheckpointSynced(Event, name="checkpoint_synced"):
    """Checkpoints were copied to remote storage."""

    entries: list[str]
    files: int
    bytes: int
    seconds: float
    dest: str
    final: bool
    busy: list[str] | None


class CheckpointPruned(Event, name="checkpoint_pruned"):
    """Older checkpoints were removed from remote storage (keeping the newest)."""

    entries: list[str]
    dest: str
    keep: int | None
