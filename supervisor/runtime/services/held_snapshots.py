"""The ranks' snapshots, held by the daemon in shared memory across generations.

Per run, one directory ``/dev/shm/ft-supervisor-<daemon pid>-<8 hex of the run token>/``
(mode 0700, created at a rank's first snapshot), and per rank two slot files
``rank<R>.<slot>`` (mode 0600) that the daemon creates and sizes (ftruncate) when the rank
asks (``snapshot_begin``); the rank maps the file and writes its state there itself. The
daemon never reads a slot: it keeps which slot is complete, with the step, length and
checksum the rank gave (``supervisor.core.memory_snapshots``), and answers a restore
with the slot that holds the newest step every rank of the node holds complete.

The slot files together never exceed the budget (``--snapshot-memory``, and /dev/shm's
free space): a begin that would is refused, told once per rank and reason, and training
goes on. The directory goes when the run ends (``release``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from supervisor.clock import Clock
from supervisor.config import memory
from supervisor.core.catalogue.snapshots import (
    SnapshotRefused,
    SnapshotRestored,
    SnapshotsReleased,
    SnapshotTaken,
)
from supervisor.core.memory_snapshots import RankSlots, common_step, held_steps
from supervisor.runtime.records.events import EventLog
from supervisor.transport import schema
from supervisor.transport.schema import Dropped, DropReason

SHM = Path("/dev/shm")  # noqa: S108 (the kernel's shared memory, not a temporary file)
PREFIX = "ft-supervisor-"
LOCK = ".lock"  # held by the daemon whose directory it is
TAKEN_EVERY = 60.0  # seconds: snapshot_taken at most this often per rank (after its first of a generation)
MAX_RANKS = 4096  # ranks of one node the table keeps (a node has tens at most)

SnapshotMessage = schema.SnapshotBegin | schema.SnapshotDone | schema.SnapshotRestore


def no_snapshots(m: SnapshotMessage, ranks: Collection[int]) -> dict[str, Any] | None:
    """The answer without a store: nothing is held, nothing can be."""
    return {"step": None} if isinstance(m, schema.SnapshotRestore) else {"ok": False, "why": "no store"}


def free_space(directory: Path) -> int:
    """Bytes an unprivileged process may still write under ``directory`` (0 when unknown)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


class HeldSnapshots:
    def __init__(
        self, events: EventLog, clock: Clock, *, budget: int | None, token: str, root: Path = SHM,
        pid: int | None = None,
    ) -> None:  # fmt: skip
        self._events, self._clock, self._root = events, clock, root
        configured = int(float(memory.DEFAULT) * memory.mem_total()) if budget is None else budget
        # never more than the shared memory can hold (what others use of it counts too)
        self.budget = min(configured, free_space(root))
        self.directory = root / f"{PREFIX}{os.getpid() if pid is None else pid}-{token[:8]}"
        self._created = False
        self.table: dict[int, RankSlots] = {}
        self.sizes: dict[tuple[int, int], int] = {}  # (rank, slot) -> the file's size
        self._refused: dict[int, set[str]] = {}  # rank -> reasons told
        self._taken: dict[int, tuple[int, float]] = {}  # rank -> (generation, when) of the last told
        self.ignored = 0  # done messages not recorded
        # the step a generation restores, fixed by its first restore: a rank that restored and
        # snapshots again changes what it holds, never what the node's other ranks restore
        self._pinned: tuple[int, int | None] | None = None  # (generation, step)
        self._restored: tuple[int, set[int]] = (-1, set())  # the generation, its ranks told restored
        self._lock: int | None = None  # held while the directory is ours (remove_stale tries it)
        # across nodes (runtime.services.job_snapshots): the bytes of replicas and staging
        # the same budget holds, a slot just completed (to replicate), each rank's source
        self.extra: Callable[[], int] = lambda: 0
        self.on_complete: Callable[[int, int], None] = lambda rank, slot: None
        self._sources: Mapping[int, str] = {}  # rank -> where its pinned step came from

    @property
    def total(self) -> int:
        return sum(self.sizes.values()) + self.extra()

    def path(self, rank: int, slot: int) -> Path:
        return self.directory / f"rank{rank}.{slot}"

    # -- the ranks' requests (from the monitor) -------------------------------------------

    def handle(self, m: SnapshotMessage, ranks: Collection[int]) -> dict[str, Any] | None:
        """The answer to ``m`` (None: a done, which has none); ``ranks``: the node's, now.
        Raises ``Dropped`` for a done that is not recorded."""
        if isinstance(m, schema.SnapshotBegin):
            return self.begin(m)
        if isinstance(m, schema.SnapshotRestore):
            return self.restore(m, ranks)
        self.done(m)
        return None

    def begin(self, m: schema.SnapshotBegin) -> dict[str, Any]:
        slots = self._slots(m.rank)
        if slots is None:
            return {"ok": False, "why": f"more than {MAX_RANKS} ranks on this node"}
        slots.begin(m.slot, m.gen, self._clock.monotonic())  # not complete, before any answer
        path = self.path(m.rank, m.slot)
        have = self.sizes.get((m.rank, m.slot), 0)
        if m.nbytes <= have:
            return {"ok": True, "path": str(path)}
        growth, over = m.nbytes - have, self.total - have + m.nbytes
        if over > self.budget:
            why = (f"{m.nbytes} bytes for slot {m.slot} would hold {over} bytes of snapshots, over the "
                   f"budget of {self.budget} (--snapshot-memory)")  # fmt: skip
            return self._refuse(m, "budget", why)
        if growth > free_space(self._root):
            return self._refuse(m, "no_space", f"{self._root} has less than {growth} bytes free")
        try:
            self._grow(path, m.nbytes)
        except OSError as exc:
            return self._refuse(m, "error", f"{path}: {exc.strerror or exc}")
        self.sizes[m.rank, m.slot] = m.nbytes
        return {"ok": True, "path": str(path)}

    def done(self, m: schema.SnapshotDone) -> None:
        slots, now = self.table.get(m.rank), self._clock.monotonic()
        size = self.sizes.get((m.rank, m.slot), 0)
        seconds = None if slots is None else slots.done(m.slot, m.gen, m.step, m.nbytes, m.checksum,
                                                        size=size, now=now)  # fmt: skip
        if seconds is None:
            self.ignored += 1
            detail = f"rank {m.rank} slot {m.slot}: not begun in generation {m.gen} or {m.nbytes} > {size}"
            raise Dropped(DropReason.SNAPSHOT_UNBEGUN, detail)
        self.on_complete(m.rank, m.slot)
        told = self._taken.get(m.rank)
        if told is None or told[0] != m.gen or now - told[1] >= TAKEN_EVERY:
            self._taken[m.rank] = (m.gen, now)
            self._events.emit(SnapshotTaken(generation=m.gen, rank=m.rank, step=m.step, bytes=m.nbytes,
                                            seconds=round(seconds, 6)))  # fmt: skip

    def restore(self, m: schema.SnapshotRestore, ranks: Collection[int]) -> dict[str, Any]:
        if self._pinned is None or self._pinned[0] != m.gen:
            self._pinned = (m.gen, common_step(held_steps(self.table, ranks)))
        step = self._pinned[1]
        slots = self.table.get(m.rank)
        found = None if step is None or slots is None else slots.holding(step)
        if found is None:
            return {"step": None}
        slot, held = found
        told = self._restored if self._restored[0] == m.gen else (m.gen, set())
        self._restored = told
        if m.rank not in told[1]:  # once per rank and generation, however often it asks
            told[1].add(m.rank)
            source = self._sources.get(m.rank, "memory")
            self._events.emit(SnapshotRestored(generation=m.gen, rank=m.rank, step=held.step,
                                               source=source, bytes=held.nbytes))  # fmt: skip
        return {"step": held.step, "path": str(self.path(m.rank, slot)), "bytes": held.nbytes,
                "checksum": held.checksum, "slot": slot}  # fmt: skip

    def pin(self, generation: int, step: int | None, sources: Mapping[int, str]) -> None:
        """The step ``generation`` restores, agreed by the whole job, and where each rank's
        came from (``memory``, ``peer``): before any rank of it asks."""
        self._pinned, self._sources = (generation, step), dict(sources)

    def reserve(self, rank: int, slot: int, nbytes: int) -> Path | str:
        """The slot file, sized for ``nbytes`` within the budget and marked incomplete, for
        the daemon itself to fill (a peer's replica); or why not."""
        slots = self._slots(rank)
        if slots is None:
            return f"more than {MAX_RANKS} ranks on this node"
        slots.begin(slot, -1, self._clock.monotonic())
        have = self.sizes.get((rank, slot), 0)
        if nbytes > have:
            if self.total - have + nbytes > self.budget:
                return f"{nbytes} bytes for rank {rank} would exceed the budget of {self.budget}"
            try:
                self.grow(self.path(rank, slot), nbytes)
            except OSError as exc:
                return f"{self.path(rank, slot)}: {exc.strerror or exc}"
            self.sizes[rank, slot] = nbytes
        return self.path(rank, slot)

    def adopt(self, rank: int, slot: int, step: int, nbytes: int, checksum: str) -> bool:
        """A reserved slot the daemon filled and verified is complete."""
        slots, size = self.table.get(rank), self.sizes.get((rank, slot), 0)
        now = self._clock.monotonic()
        recorded = None if slots is None else slots.done(slot, -1, step, nbytes, checksum, size=size, now=now)
        return recorded is not None

    def grow(self, path: Path, size: int) -> None:
        """Create or grow a file of the run's directory (the directory too, at first)."""
        self._grow(path, size)

    def _slots(self, rank: int) -> RankSlots | None:
        slots = self.table.get(rank)
        if slots is None and len(self.table) < MAX_RANKS:
            slots = self.table[rank] = RankSlots()
        return slots

    def _refuse(self, m: schema.SnapshotBegin, reason: str, why: str) -> dict[str, Any]:
        told = self._refused.setdefault(m.rank, set())
        if reason not in told:
            told.add(reason)
            self._events.emit(SnapshotRefused(generation=m.gen, rank=m.rank, bytes=m.nbytes,
                                              budget=self.budget, why=why))  # fmt: skip
        return {"ok": False, "why": why}

    def _grow(self, path: Path, size: int) -> None:
        if not self._created:
            self.directory.mkdir(mode=0o700, exist_ok=True)
            self._lock = _locked(self.directory / LOCK)
            if self._lock is None:
                raise OSError(f"{self.directory} is held by another daemon")
            self._created = True
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    # -- status and the end ---------------------------------------------------------------

    def describe(self, now: float) -> dict[str, Any]:
        """Per rank its newest complete step, its age and size; the bytes held, the budget."""
        ranks = {}
        for rank, slots in sorted(self.table.items()):
            newest = slots.newest()
            if newest is not None:
                ranks[str(rank)] = {"step": newest.step, "age_s": round(now - newest.at, 3),
                                    "bytes": newest.nbytes}  # fmt: skip
        return {"ranks": ranks, "bytes": self.total, "budget": self.budget,
                "directory": str(self.directory) if self._created else None}  # fmt: skip

    def release(self) -> None:
        """The run ended: the files go, and the directory with them."""
        if not self._created:
            return
        files, held = len(self.sizes), self.total
        shutil.rmtree(self.directory, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
        self.table, self.sizes, self._created, self._lock = {}, {}, False, None
        self._events.emit(SnapshotsReleased(bytes=held, files=files, directory=str(self.directory)))


def remove_stale(root: Path = SHM) -> list[Path]:
    """Directories of daemons that died without removing theirs: ours (the same user), whose
    lock no process holds (a daemon of another pid namespace sharing /dev/shm holds its own)."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            if not entry.name.startswith(PREFIX):
                continue
            with contextlib.suppress(OSError):
                st = entry.lstat()
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                    continue
                fd = _locked(entry / LOCK)
                if fd is None:
                    continue  # held: a live daemon's
                try:
                    shutil.rmtree(entry)
                finally:
                    os.close(fd)
                removed.append(entry)
    return removed


def _locked(path: Path) -> int | None:
    """An open file holding ``path``'s exclusive lock (never waited for); None when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd
