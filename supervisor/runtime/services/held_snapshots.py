"""The ranks' snapshots, held by the daemon in shared memory across generations.

Per run, one directory ``/dev/shm/ft-supervisor-<daemon pid>-<8 hex of the run token>/``
(mode 0700, created at a rank's first snapshot), and per rank two slot files
``rank<R>.<slot>`` (mode 0600) that the daemon creates and sizes when the rank asks
(``snapshot_begin``); the rank maps the file and writes its state there itself. A file
that grows gets its pages reserved (``posix_fallocate``) before the begin is answered, in a
thread off the daemon's loop (0.3-0.4 s a GB here): a rank that mapped a sparse file would
take SIGBUS on the first page /dev/shm no longer has room for, once something else filled
it after the budget check; reserved, the pages are the rank's, and a reservation that finds
no room is a refusal like the budget's. The
daemon never reads a slot: it keeps which slot is complete, with the step, length and
checksum the rank gave (``supervisor.core.memory_snapshots``), and answers a restore
with the slot that holds the newest step every rank of the node holds complete.

The slot files together never exceed the budget (``--snapshot-memory``, and /dev/shm's
free space at start): a begin that would is refused, told once per rank and reason, and
training goes on. The directory goes when the run ends (``release``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import shutil
import stat
from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from supervisor.clock import Clock
from supervisor.config import memory
from supervisor.core.catalogue.snapshots import (
    ResumeChosen,
    SnapshotRefused,
    SnapshotRestored,
    SnapshotsReleased,
    SnapshotTaken,
)
from supervisor.core.memory_snapshots import RankSlots, common_step, held_steps
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.services.slot_seals import read_sealed
from supervisor.transport import schema
from supervisor.transport.schema import Dropped, DropReason

SHM = Path("/dev/shm")  # noqa: S108 (the kernel's shared memory, not a temporary file)
PREFIX = "ft-supervisor-"
LOCK = ".lock"  # held by the daemon whose directory it is
TAKEN_EVERY = 60.0  # seconds: snapshot_taken at most this often per rank (after its first of a generation)
MAX_RANKS = 4096  # ranks of one node the table keeps (a node has tens at most)
RESERVING = 2  # slot files reserved at once, each in a thread: the rest wait their turn

SnapshotMessage = schema.SnapshotBegin | schema.SnapshotDone | schema.SnapshotRestore | schema.Resumed
Answer = dict[str, Any] | Awaitable[dict[str, Any]] | None  # awaitable: a slot file being reserved


def no_snapshots(m: SnapshotMessage, ranks: Collection[int]) -> Answer:
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
        # (rank, slot) -> its reservation in a thread and the size it reserves (counted as held)
        self._growing: dict[tuple[int, int], tuple[asyncio.Future[dict[str, Any]], int]] = {}
        self._reserving = asyncio.Semaphore(RESERVING)
        self._refused: dict[int, set[str]] = {}  # rank -> reasons told
        self._taken: dict[int, tuple[int, float]] = {}  # rank -> (generation, when) of the last told
        self.ignored = 0  # done messages not recorded
        # the step a generation restores, fixed by its first restore: a rank that restored and
        # snapshots again changes what it holds, never what the node's other ranks restore
        self._pinned: tuple[int, int | None] | None = None  # (generation, step)
        self._restored: tuple[int, set[int]] = (-1, set())  # the generation, its ranks told restored
        self._lock: int | None = None  # held while the directory is ours (remove_stale tries it)
        self._sealed: tuple[int, asyncio.Future[int]] | None = None  # (generation, its seal)
        # across nodes (runtime.services.job_snapshots): the bytes of replicas, staging and
        # retained copies the same budget holds, a slot just completed (to replicate), each
        # rank's source, and the retained copies' room given back when a rank needs it
        self.extra: Callable[[], int] = lambda: 0
        self.reclaim: Callable[[int], int] = lambda need: 0
        self.on_complete: Callable[[int, int], None] = lambda rank, slot: None
        self._sources: Mapping[int, str] = {}  # rank -> where its pinned step came from

    @property
    def total(self) -> int:
        growing = {key: size for key, (_, size) in self._growing.items()}
        held = sum(max(self.sizes.get(key, 0), growing.get(key, 0)) for key in self.sizes.keys() | growing)
        return held + self.extra()  # and the replicas this node keeps for its peer

    def path(self, rank: int, slot: int) -> Path:
        return self.directory / f"rank{rank}.{slot}"

    # -- the ranks' requests (from the monitor) -------------------------------------------

    async def seal(self, before: int) -> int:
        """Slots that ranks of generations before ``before`` (gone now) copied whole but died
        before saying so: recorded complete from their header's seal, with a checksum the
        daemon takes (in a thread); the number recorded. Anything else stays incomplete."""
        found = [(rank, slot) for rank, slots in self.table.items() for slot in slots.unfinished(before)]
        recorded = 0
        for rank, slot in found:
            size = self.sizes.get((rank, slot), 0)
            try:
                got = await asyncio.to_thread(read_sealed, self.path(rank, slot), size)
            except OSError:
                continue
            slots = self.table.get(rank)
            if got is None or slots is None:
                continue
            step, nbytes, checksum = got
            if slots.seal(slot, step, nbytes, checksum, size=size, now=self._clock.monotonic()):
                recorded += 1
                self._events.emit(SnapshotTaken(generation=before - 1, rank=rank, step=step, bytes=nbytes,
                                                seconds=None, sealed=True))  # fmt: skip
        return recorded

    def handle(self, m: SnapshotMessage, ranks: Collection[int]) -> Answer:
        """The answer to ``m`` (None: a done, which has none; an awaitable: a begin whose
        slot file is being reserved); ``ranks``: the node's, now. Raises ``Dropped`` for a
        done that is not recorded."""
        if isinstance(m, schema.SnapshotBegin):
            return self.begin(m)
        if isinstance(m, schema.Resumed):
            self._events.emit(ResumeChosen(generation=m.gen, rank=m.rank, source=m.source, step=m.step,
                                           why=m.why))  # fmt: skip
            return None
        if isinstance(m, schema.SnapshotRestore):
            if any(slots.unfinished(m.gen) for slots in self.table.values()):
                return self._sealed_then_restore(m, ranks)
            return self.restore(m, ranks)
        self.done(m)
        return None

    def begin(self, m: schema.SnapshotBegin) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        slots = self._slots(m.rank)
        if slots is None:
            return {"ok": False, "why": f"more than {MAX_RANKS} ranks on this node"}
        slots.begin(m.slot, m.gen, self._clock.monotonic())  # not complete, before any answer
        growing = self._growing.get((m.rank, m.slot))
        if growing is not None:  # asked again (the rank gave up waiting): once that one is done
            return self._after(growing[0], m)
        path = self.path(m.rank, m.slot)
        have = self.sizes.get((m.rank, m.slot), 0)
        if m.nbytes <= have:
            return {"ok": True, "path": str(path)}
        if self.total - have + m.nbytes > self.budget:
            self.reclaim(self.total - have + m.nbytes - self.budget)  # the ranks' own come first
        over = self.total - have + m.nbytes
        if over > self.budget:
            why = (f"{m.nbytes} bytes for slot {m.slot} would hold {over} bytes of snapshots, over the "
                   f"budget of {self.budget} (--snapshot-memory)")  # fmt: skip
            return self._refuse(m, "budget", why)
        try:
            self._own_directory()
        except OSError as exc:
            return self._refuse(m, "error", f"{self.directory}: {exc.strerror or exc}")
        task = asyncio.ensure_future(self._grow(m, path))
        self._growing[m.rank, m.slot] = (task, m.nbytes)
        return task

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
        """Create or grow a file the daemon itself writes (a replica, a staged copy, a slot it
        fills from a peer) in the run's directory (the directory too, at first). Not reserved:
        the daemon writes every byte of it before anyone maps it."""
        self._own_directory()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    async def _sealed_then_restore(self, m: schema.SnapshotRestore, ranks: Collection[int]) -> dict[str, Any]:
        await self.sealed_before(m.gen)
        return self.restore(m, ranks)

    async def sealed_before(self, before: int) -> None:
        """``seal`` once per generation, however many ranks (or the job's agreement) ask."""
        if self._sealed is None or self._sealed[0] != before:
            self._sealed = (before, asyncio.ensure_future(self.seal(before)))
        await asyncio.shield(self._sealed[1])

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

    def _own_directory(self) -> None:
        if not self._created:
            self.directory.mkdir(mode=0o700, exist_ok=True)
            self._lock = _locked(self.directory / LOCK)
            if self._lock is None:
                raise OSError(f"{self.directory} is held by another daemon")
            self._created = True

    async def _grow(self, m: schema.SnapshotBegin, path: Path) -> dict[str, Any]:
        """The begin's answer once the slot file's pages are reserved (in a thread: the
        loop goes on meanwhile; RESERVING at once)."""
        key = (m.rank, m.slot)
        try:
            async with self._reserving:
                await asyncio.to_thread(reserve, path, m.nbytes)
        except OSError as exc:
            if not self._created:
                return {"ok": False, "why": "the run's snapshots were released"}
            if exc.errno == errno.ENOSPC:
                why = f"{self._root} has no room left for {m.nbytes} bytes for slot {m.slot} ({exc.strerror})"
                return self._refuse(m, "no_space", why)
            return self._refuse(m, "error", f"{path}: {exc.strerror or exc}")
        finally:
            self._growing.pop(key, None)
        if not self._created:
            return {"ok": False, "why": "the run's snapshots were released"}
        self.sizes[key] = max(self.sizes.get(key, 0), m.nbytes)
        return {"ok": True, "path": str(path)}

    async def _after(
        self, growing: asyncio.Future[dict[str, Any]], m: schema.SnapshotBegin
    ) -> dict[str, Any]:
        with contextlib.suppress(Exception):
            await asyncio.shield(growing)
        answer = self.begin(m)
        return answer if isinstance(answer, dict) else await answer

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


def reserve(path: Path, size: int) -> None:
    """Create the slot file when new and give it ``size`` bytes of pages now (ENOSPC when
    the shared memory has no room for them: the file keeps its size)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


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
