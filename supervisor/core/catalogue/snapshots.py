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
    sealed: bool = False  # the rank died before its done: recorded from the slot's seal (always told)


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
    source: str  # memory, or peer (a replica another node's daemon kept, fetched at start)
    bytes: int


class ResumeChosen(Event, name="resume_chosen"):
    """Where a rank resumed from (``client.resume``), and why.

    Its memory snapshot or its disk checkpoint (the newer wins), or the beginning."""

    generation: int | None
    rank: int
    source: str  # memory, disk or none
    step: int | None
    why: str


class SnapshotsReleased(Event, name="snapshots_released"):
    """The run ended: the snapshots' shared-memory files were removed."""

    bytes: int
    files: int
    directory: str | None = None


class SnapshotsAgreed(Event, name="snapshots_agreed"):
    """The nodes of a job agreed which step a generation's ranks restore from memory (or none).

    The newest step every rank of the job holds complete, in its own node's memory or a
    peer's replica; None: no memory restore this generation, and why (a node that did not
    publish in time, no common step, a replica that could not be fetched): the ranks start
    from disk or afresh."""

    generation: int | None
    step: int | None
    why: str
    peers: list[int]  # this node's ranks whose step comes from a peer's replica
    seconds: float  # from this node's join to the agreement
    retained: list[int] | None = None  # this node's ranks whose step comes from its retained copy


class SnapshotReplicated(Event, name="snapshot_replicated"):
    """A rank's complete snapshot is kept by the next node's daemon (sampled: once a minute).

    A rank's first of a generation, then one a minute: the copies go on every step."""

    generation: int | None
    rank: int
    step: int
    bytes: int
    peer: int  # the node rank that keeps it
    seconds: float  # from the snapshot's completion here to the peer's verified copy


class SnapshotReplicationFailed(Event, name="snapshot_replication_failed", level=WARNING):
    """Replicas cannot reach the next node: it vanished mid-copy, refused one, or is unreachable.

    Told once per peer and generation; the snapshots held here are untouched, and the copies
    resume when the job agrees on a peer again (the next generation)."""

    generation: int | None
    rank: int
    step: int
    peer: int
    why: str


class SnapshotReplicaRejected(Event, name="snapshot_replica_rejected", level=WARNING):
    """This daemon refused a replica another node offered, or lost one mid-copy.

    A header that does not check out, no room in --snapshot-memory, bytes that do not match
    their checksum, a sender gone mid-copy. Once per reason; the replicas it kept complete
    are untouched."""

    node: int | None
    rank: int | None
    step: int | None
    why: str


class SnapshotStrideChanged(Event, name="snapshot_stride_changed"):
    """Replication now sends every N-th step only, the same steps on every node of the job.

    Wider: a copy ended a stride or more behind its rank's newest step (too large a snapshot
    for --snapshot-replication-rate in a step), or another node uses a wider stride. At each
    agreement: the widest the nodes' recent copies needed, narrower after a slow spell. Each
    node keeps its own ranks' last two replicated steps (retained), so a lost node restoring
    from an older replica still finds its step on every other node."""

    generation: int | None
    stride: int
    lag_steps: int | None  # the lag that widened it here; None: a peer or the agreement said so
    why: str


class SnapshotRetainedDropped(Event, name="snapshot_retained_dropped", level=WARNING):
    """A retained copy (a replicated step kept for the job's agreement) was dropped for room.

    --snapshot-memory is short: a rank's own slot, a peer's replica or the next copy to
    send needed the room, and they come first. Told once per reason; a lost node's
    replica lagging by more than a step may then find no common step (the job uses disk)."""

    rank: int
    step: int
    bytes: int
    why: str


class SnapshotReplicasReleased(Event, name="snapshot_replicas_released"):
    """Replicas of ranks nobody replicates here any more were released, with their memory.

    The job's membership or order changed (a node gone for good, ranks elsewhere now):
    the node that sends here does not run them. Told after the generation's agreement,
    whose fetches they may have served."""

    generation: int | None
    ranks: list[int]
    bytes: int
    why: str
