"""A rank's training state held in memory by its node's daemon: ``snapshot`` every step,
``restore`` after a restart.

    state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": step}
    client.snapshot(state, step)         # every step: returns once the state is copied
    ...
    held = client.restore()              # at start: None, or (step, state)
    if held is not None:
        step, state = held
        model.load_state_dict(state["model"])

The daemon owns two slot files per rank in shared memory (``/dev/shm``); the rank writes
them in turn (0, 1, 0, ...), so the slot it overwrites is never the one holding its newest
complete step. A slot is complete once the daemon recorded its step, size and checksum,
which the rank reports from a background thread after the copy. A rank's death, a hang's
kill and a restart lose nothing the daemon recorded; a copy cut off by a crash leaves the
other slot as it was. The slot file's format is ``supervisor.client.snapshot_slots``'s.

A warm standby has its rank's slot files mapped, their pages faulted in, before its go
(its bootstrap does it while it waits: ``supervisor/process/bootstrap_premap.py``):
``restore`` then checks and uses that mapping of the slot the daemon names instead of
mapping the file again and faulting its pages in (about 30 % of a restore's CPU at 1 GB).
It also has both slot files mapped shared and writable, their pages populated: its slots'
writers take those mappings (``writers_from``), so the first snapshots after the go do not
fault every page of a slot in for writing on the training thread (about 1 s per GB here).
"""

from __future__ import annotations

import atexit
import operator
import os
import queue
import re
import sys
import threading
import uuid
import weakref
from collections.abc import Mapping
from mmap import mmap
from pathlib import Path
from typing import Any

from supervisor.client import snapshot_slots as slotfile
from supervisor.client.connection import Client
from supervisor.client.connection import current as _get
from supervisor.client.connection import held as _held
from supervisor.client.snapshot_cuda import Copying
from supervisor.client.snapshot_slots import SlotError, Writer

BEGIN_TIMEOUT = 1.0  # the daemon answers a begin in well under a millisecond when idle
# a begin that grows the slot file (twice a run per rank) is answered once the daemon
# reserved its pages in a thread: 0.4 s a GB on an idle 2-core machine, plus the thread's
# turn and the loop's, each a second or more on a loaded one
RESERVE_WAIT, RESERVE_RATE = 3.0, 256 << 20  # seconds, and bytes per second
# a multi-node job answers once every node agreed on the step and fetched what it lacks
# from its peer (runtime.services.job_snapshots: at most ~65 s); a rank that gave up
# sooner would start afresh beside ranks that restored
RESTORE_TIMEOUT = 90.0
BACKGROUND_TIMEOUT = 60.0  # the previous snapshot's checksum, before its slot is overwritten
EXIT_FLUSH_TIMEOUT = 2.0  # at exit: the last snapshot's checksum and done message
SLOT_NAME = re.compile(r"rank(\d+)\.([01])")
# a standby's bootstrap module holding its premapped slots (supervisor/process/bootstrap_premap.py),
# found by name: the client imports nothing of supervisor.process
PREMAP = "_ft_supervisor_bootstrap_premap"


def snapshot(state: Mapping[str, Any], step: int, *, timeout: float = BEGIN_TIMEOUT) -> bool:
    """Hand ``state`` at ``step`` to the daemon, to be held in memory until the next.

    ``state``: a mapping of tensors (dense), numpy arrays, numbers, strings, bytes, None
    and nested mappings, lists and tuples of those: a model's and an optimizer's
    ``state_dict()``, the data loader's position, the RNG states. A state without
    tensors needs no torch.

    **What blocks the training thread**: walking ``state`` (flattening it into a skeleton
    and a list of tensors), one round trip to the daemon (``snapshot_begin``: the daemon
    marks the slot incomplete and sizes its file; ``timeout`` s at most, plus the time to
    reserve the pages of a slot file that grows: once per slot), waiting for the
    previous snapshot's checksum of the slot about to be overwritten (two snapshots ago:
    normally long done), and the copy of every host tensor into the mapped slot (a memcpy).
    Tensors on CUDA devices are only enqueued: copied asynchronously into the slot's
    mapping, page-locked on the first snapshot into it, on each device's current stream
    (after the kernels that made them, before any queued later; other devices' tensors
    are copied synchronously). When it returns, ``state`` may change (on the host at
    once; on a device through the current stream, as usual): the slot holds, or will hold,
    a copy. Waiting for the device's copies, sealing and checksumming the slot and the
    ``snapshot_done`` message that makes it complete run in a background thread.

    True when the state was copied into a slot; False when no daemon supervises this
    rank, none answered within ``timeout`` seconds, or the daemon refused it (its
    ``--snapshot-memory`` budget is full: one line on stderr per reason, training goes on).
    A value that cannot be held raises TypeError naming it. Call it every step.
    """
    if isinstance(step, bool) or operator.index(step) < 0:
        raise ValueError(f"step must be an int >= 0, not {step!r}")
    step = operator.index(step)
    c = _held.client or _get()
    if c is None:
        return False
    return _for(c).take(state, step, timeout)


def restore(*, timeout: float = RESTORE_TIMEOUT) -> tuple[int, dict[str, Any]] | None:
    """``(step, state)``: the newest step that every rank of the job holds complete, as
    this rank snapshotted it; None when there is none, no daemon supervises this rank or
    none answered within ``timeout`` seconds (a multi-node job answers once its nodes agreed).

    The slot is checked against the size and checksum the daemon recorded before any of
    it is used: a mismatch returns None with one line on stderr saying why, never a torn
    or mixed state. Tensors come back on the CPU as views of a copy-on-write mapping of
    the slot (no second copy; modifying them leaves the slot as it was); containers come
    back as dicts, lists and tuples. A warm standby's restore uses the mapping it made
    while it waited for its go (checked the same way: a newer snapshot sealed into the slot
    since shows through it, and the checks are against what the daemon recorded now).
    """
    c = _held.client or _get()
    if c is None:
        return None
    return _for(c).restore(timeout)


def restored_from() -> str | None:
    """How this process's last ``restore`` read its slot: ``"premapped"`` (a standby's mapping,
    made before its go), ``"mapped"`` (mapped then), None (no slot read: none held, no daemon)."""
    s = _Current.snapshots
    return None if s is None or s.pid != os.getpid() else s.served


def writers_from() -> tuple[str | None, str | None]:
    """How each slot's writer was mapped in this process: ``"premapped"`` (a standby's
    mapping, made before its go), ``"mapped"`` (by its first snapshot), None (not yet)."""
    s = _Current.snapshots
    if s is None or s.pid != os.getpid():
        return None, None
    return s.slots[0].via, s.slots[1].via


def tell(kind: str, **fields: Any) -> None:
    """A fire-and-forget message to the daemon about snapshots (nothing without one)."""
    c = _held.client or _get()
    if c is not None:
        c.send(kind, **fields)


class _Slot:
    def __init__(self) -> None:
        self.path: str | None = None
        self.writer: Writer | None = None
        self.idle = threading.Event()  # no background work on this slot
        self.idle.set()
        self.restored: weakref.ref[mmap] | None = None  # a restore's mapping of this slot
        self.via: str | None = None  # how the writer's mapping was made: "premapped" or "mapped"


class _Snapshots:
    """One process's snapshots: its two slots, the next to write, the background thread."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.pid = os.getpid()
        self.slots = (_Slot(), _Slot())
        self.next = 0
        self.jobs: queue.SimpleQueue[tuple[int, int, int, Copying | None]] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.said: str | None = None  # the last line said on stderr: said once, not per step
        self.served: str | None = None  # how the last restore read its slot: "premapped" or "mapped"

    def take(self, state: Mapping[str, Any], step: int, timeout: float) -> bool:
        self.adopt()
        _premap("release")  # not restoring, or restored: what a standby mapped is of no more use
        p = slotfile.plan(state)
        number = self.next
        slot = self.slots[number]
        if not slot.idle.wait(BACKGROUND_TIMEOUT):
            self.say(
                f"snapshot of step {step} skipped: the checksum of slot {number} is still running",
                key="checksum late",
            )
            return False
        self._detach_restored(slot)
        request_id = uuid.uuid4().hex[:16]
        self.client.send("snapshot_begin", id=request_id, slot=number, bytes=p.total)
        mapped = slot.writer is not None and len(slot.writer.mapping) >= p.total
        wait = timeout if mapped else timeout + RESERVE_WAIT + p.total / RESERVE_RATE  # it may grow first
        reply = self.client.channel.await_reply(request_id, wait)
        if reply is None:
            self.say(
                f"snapshots skipped from step {step}: the daemon did not answer within {timeout:g} s",
                key="no answer",
            )
            return False
        path = reply.get("path")
        if reply.get("ok") is not True or not isinstance(path, str):
            why = str(reply.get("why") or "no reason given")[:500]
            self.say(f"snapshot of {p.total} bytes refused by the daemon: {why}; training goes on", key=why)
            return False
        try:
            writer = self._writer(slot, path, p.total)
            copying = writer.write(p, step)
        except (OSError, SlotError) as e:
            self.say(f"snapshot of step {step} not written to {path}: {e}", key=str(e))
            return False
        if writer.lock.failure is not None:
            self.say(f"copies from the GPU into slot {number} wait for the device: {writer.lock.failure}")
        else:
            self.said = None
        slot.idle.clear()
        self._start()
        self.jobs.put((number, step, p.total, copying))
        self.next = 1 - number
        return True

    def _writer(self, slot: _Slot, path: str, nbytes: int) -> Writer:
        if slot.writer is not None and slot.path == path and len(slot.writer.mapping) >= nbytes:
            return slot.writer  # the same file, still large enough: its pages are already there
        if slot.writer is not None:
            slot.writer.close()
            slot.writer = None
        slot.writer, slot.path = Writer(slotfile.map_for_writing(path, nbytes)), path
        slot.via = "mapped"
        return slot.writer

    def adopt(self) -> None:
        """A standby's writable mappings of its slot files, made before its go, become its
        slots' writers (``_writer`` still checks each against the file the daemon names)."""
        if PREMAP not in sys.modules:
            return
        for number, slot in enumerate(self.slots):
            got = _premap_writable(number)
            if got is not None and slot.writer is None:
                slot.path, slot.writer, slot.via = got[0], Writer(got[1]), "premapped"

    def _detach_restored(self, slot: _Slot) -> None:
        # tensors a restore returned still map this slot: their pages must stop showing
        # the file before it is overwritten (once, after a restore, for what is still held)
        mapping = slot.restored() if slot.restored is not None else None
        slot.restored = None
        if mapping is not None:
            slotfile.make_private(mapping)

    def _start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name="ft-snapshot-checksum", daemon=True)
            self.thread.start()
            atexit.register(self.wait_idle, EXIT_FLUSH_TIMEOUT)

    def _work(self) -> None:
        while True:
            number, step, nbytes, copying = self.jobs.get()
            slot = self.slots[number]
            try:
                assert slot.writer is not None
                if copying is not None:  # copies from a GPU: the slot is whole once they are done
                    copying.wait()
                    slot.writer.seal(nbytes, step)
                digest = slotfile.checksum(slot.writer.mapping, nbytes)
                self.client.send("snapshot_done", slot=number, step=step, bytes=nbytes, checksum=digest)
            except Exception as e:  # say it; the slot stays incomplete
                self.say(f"snapshot of step {step} not completed: {type(e).__name__}: {e}")
            finally:
                slot.idle.set()

    def wait_idle(self, timeout: float) -> bool:
        return all(slot.idle.wait(timeout) for slot in self.slots)

    def restore(self, timeout: float) -> tuple[int, dict[str, Any]] | None:
        self.wait_idle(BACKGROUND_TIMEOUT)
        self.adopt()  # before read_held releases what the standby mapped
        self.served = None
        request_id = uuid.uuid4().hex[:16]
        self.client.send("snapshot_restore", id=request_id)
        reply = self.client.channel.await_reply(request_id, timeout)
        if reply is None:
            self.say(f"restore: the daemon did not answer within {timeout:g} s; nothing restored")
            return None
        step, path, nbytes, digest = (reply.get(k) for k in ("step", "path", "bytes", "checksum"))
        if step is None:
            return None
        name = SLOT_NAME.fullmatch(Path(path).name) if isinstance(path, str) else None
        if (name is None or int(name.group(1)) != self.client.rank or not isinstance(step, int)
                or not isinstance(nbytes, int) or not isinstance(digest, str)):  # fmt: skip
            self.say(f"restore: an answer this rank cannot use ({reply}); nothing restored")
            return None
        number = int(name.group(2))
        assert isinstance(path, str)
        try:
            held_step, state, mapping, self.served = read_held(path, nbytes, digest, step)
        except SlotError as e:
            self.say(f"restore of step {step} refused: {e}; nothing restored")
            self.next = number  # the damaged slot is the one to overwrite first
            return None
        self.slots[number].restored = weakref.ref(mapping)
        self.next = 1 - number
        return held_step, state

    def say(self, line: str, *, key: str | None = None) -> None:
        """One line on stderr, unless the last one said the same (``key``, else the line)."""
        key = line if key is None else key
        if key != self.said:
            self.said = key
            sys.stderr.write(f"supervisor.client: {line}\n")
            sys.stderr.flush()


def read_held(path: str, nbytes: int, checksum: str, step: int) -> tuple[int, dict[str, Any], mmap, str]:
    """``restore``'s read of the slot file the daemon named, recorded with ``nbytes``,
    ``checksum`` and ``step``: the step, the state, its mapping and how the slot was read,
    ``"premapped"`` (a standby's mapping of it, made before its go) or ``"mapped"`` (now).
    SlotError when the slot does not hold what the daemon recorded, however it was read."""
    mapped = _premap("take", path, nbytes)
    if PREMAP in sys.modules:
        # the rank's other slot, written next and never read: unmapped off the restore's path
        # (its populated page tables take ~0.1 CPU-s a GB to tear down; munmap leaves the GIL)
        threading.Thread(target=_premap, args=("release",), name="ft-premap-release", daemon=True).start()
    held_step, state, mapping = slotfile.read_slot(path, nbytes, checksum, step, mapped=mapped)
    return held_step, state, mapping, "mapped" if mapped is None else "premapped"


def _premap(call: str, *args: Any) -> mmap | None:
    """``take`` (a mapping of a slot file) or ``release`` of a standby's premap, when this
    process was one; None otherwise. Its failure costs the premap, never the restore."""
    module = sys.modules.get(PREMAP)
    try:
        got = getattr(module, call)(*args) if module is not None else None
    except Exception:  # the restore maps the file itself
        return None
    return got if isinstance(got, mmap) else None


def _premap_writable(slot: int) -> tuple[str, mmap] | None:
    """A standby's writable mapping of slot ``slot``'s file, with its path; None when this
    process was no standby or has none (its failure costs the premap, never a snapshot)."""
    module = sys.modules.get(PREMAP)
    try:
        got = module.take_writable(slot) if module is not None else None
    except Exception:
        return None
    if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], str) and isinstance(got[1], mmap):
        return got[0], got[1]
    return None


class _Current:
    snapshots: _Snapshots | None = None
    lock = threading.Lock()


def _for(client: Client) -> _Snapshots:
    """This process's snapshots for ``client`` (new after a fork or a new connection)."""
    with _Current.lock:
        s = _Current.snapshots
        if s is None or s.client is not client or s.pid != os.getpid():
            s = _Current.snapshots = _Snapshots(client)
        return s
