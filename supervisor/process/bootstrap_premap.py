"""A warm standby maps its rank's snapshot slots while it waits for its go.

A rank's ``client.restore()`` after a restart maps its slot file (``rank<R>.<slot>`` in
the daemon's snapshot directory) and reads all of it for the checksum: a good part of that
time (about 30 % of its CPU time at 1 GB here) is the kernel faulting the slot's pages into
the new mapping one by one (4 KiB each), on the restart's critical path. A standby has
nothing to do until its go, so it does that part then: the daemon names the directory in
``FT_SUPERVISOR_PREMAP`` (standbys only), and the bootstrap, waiting for the go, maps its
own rank's two slot files and has their pages faulted in (``MADV_POPULATE_READ``), again
whenever a file appears or grows (every ``REFRESH_S`` seconds it looks: two ``stat``
calls). ``client.restore()`` then takes the mapping of the slot the daemon names
(``take``) instead of mapping the file again. The checksum stays on the restore's path: a
hash taken before the go would miss a slot damaged between the go and the restore.

What it holds never decides anything: the mapping shows the file as it is now (a newer
snapshot the dying rank sealed into the slot since shows through), and the client checks
it against the step, size and checksum the daemon recorded, as it checks a mapping of its
own, before any of it is used. Bounded: only this rank's two files, opened read-only
(``O_NOFOLLOW``, regular files), mapped private (copy-on-write: a restored tensor the
program modifies never writes the slot), no memory of its own (the pages are the file's).

The rank's first snapshots after its go write into its slot files too: the slot it did not
restore from first, then the other. A mapping the rank made then would fault each page in
for writing, 4 KiB at a time (about 1 s per GB on a loaded 2-core machine, in the first
step's snapshot, on the restart's critical path). So the standby also maps both files
shared and writable and has their pages populated for writing (``MADV_POPULATE_WRITE``:
the pages are the file's, already there, so nothing is allocated and not a byte changes);
the client's snapshots take those mappings as their slots' writers (``take_writable``).
The same bounds: only this rank's two files (``O_RDWR | O_NOFOLLOW``, regular files), the
pages the file's (no memory of its own, only page tables). A rank writes only its own slots
either way; its standby writes nothing before its go.

The bootstrap loads this file by its path, for a standby the daemon gave the variable,
as ``_ft_supervisor_bootstrap_premap`` in ``sys.modules``, and calls ``wait`` before it
reads its go: the client finds ``take``, ``take_writable`` and ``release`` there by that name
(``supervisor.client.snapshots``), never by an import (the client imports nothing of
``supervisor.process``). Standard library only, like the bootstrap.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import stat
import sys

NAME = "_ft_supervisor_bootstrap_premap"  # in sys.modules, where the client looks for it
ENV = "FT_SUPERVISOR_PREMAP"  # the daemon's snapshot directory (supervisor.core.topology)
REFRESH_S = 1.0  # seconds between two looks at the slot files while waiting
MADV_POPULATE_READ = 22  # Linux 5.14: fault the pages in, an error (never SIGBUS) where it cannot
MADV_POPULATE_WRITE = 23  # the same, writable (a shared mapping: the file's pages, marked dirty)
SLOTS = (0, 1)


class Premap:
    """One standby's mappings of its rank's slot files: path -> (mapping, (device, inode, size)),
    copy-on-write for its restore (``held``), shared and writable for its snapshots (``writable``)."""

    def __init__(self, directory: str, rank: str) -> None:
        self.paths = [os.path.join(directory, f"rank{int(rank)}.{slot}") for slot in SLOTS]
        self.held: dict[str, tuple[mmap.mmap, tuple[int, int, int]]] = {}
        self.writable: dict[str, tuple[mmap.mmap, tuple[int, int, int]]] = {}
        self.populated = True  # the kernel can fault pages in ahead (false: mapped only)

    def refresh(self) -> None:
        """Map a slot file that is new or grew since the last look; drop one that went."""
        for path in self.paths:
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                self._drop(path)
                continue
            key = (st.st_dev, st.st_ino, st.st_size)
            held = self.held.get(path)
            if held is not None and held[1] == key:
                continue
            self._drop(path)
            if stat.S_ISREG(st.st_mode) and st.st_size > 0:
                for table, writable in ((self.held, False), (self.writable, True)):
                    mapping = _map(path, st.st_size, writable=writable)
                    if mapping is not None:
                        table[path] = (mapping, key)
                        self._populate(mapping, MADV_POPULATE_WRITE if writable else MADV_POPULATE_READ)

    def _populate(self, mapping: mmap.mmap, advice: int) -> None:
        if not self.populated:
            return
        try:
            mapping.madvise(advice)
        except (OSError, ValueError, AttributeError):
            # an older kernel: the pages fault in when read, as without a premap (reading
            # them here could SIGBUS on a hole the shared memory has no room to fill)
            self.populated = False

    def wait(self, fd: int) -> None:
        """Keep the mappings current until ``fd`` (the boot channel) has the go or EOF; a
        last look then (cheap when nothing changed: a file that grew meanwhile is mapped)."""
        self.refresh()
        while True:
            try:
                if select.select([fd], [], [], REFRESH_S)[0]:
                    break
            except InterruptedError:
                continue
            except (OSError, ValueError):
                break  # the read that follows says what the channel has
            self.refresh()
        self.refresh()

    def take(self, path: str, nbytes: int) -> mmap.mmap | None:
        """The mapping of ``path`` (the caller's from now on), when it holds ``nbytes`` and
        the file is still the one mapped (not replaced, not shrunk); None otherwise."""
        return _checked(self.held.pop(path, None), path, nbytes)

    def take_writable(self, slot: int) -> tuple[str, mmap.mmap] | None:
        """``(path, mapping)``: slot ``slot``'s file mapped shared and writable, all of it (the
        caller's from now on), when the file is still the one mapped; None otherwise."""
        path = self.paths[slot]
        mapping = _checked(self.writable.pop(path, None), path, 0)
        return None if mapping is None else (path, mapping)

    def release(self) -> None:
        """Unmap everything not taken (once the rank restored, or snapshots without restoring)."""
        for path in list(self.held) + list(self.writable):
            self._drop(path)
        sys.modules.pop(NAME, None)

    def _drop(self, path: str) -> None:
        for table in (self.held, self.writable):
            held = table.pop(path, None)
            if held is not None:
                _close(held[0])


def _checked(held: tuple[mmap.mmap, tuple[int, int, int]] | None, path: str, nbytes: int) -> mmap.mmap | None:
    """The mapping of ``held`` when ``path`` is still the file mapped (not replaced, not shrunk)
    and the mapping holds ``nbytes``; None (and the mapping closed) otherwise."""
    if held is None:
        return None
    mapping, key = held
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        st = None
    replaced = st is None or (st.st_dev, st.st_ino) != key[:2] or st.st_size < len(mapping)
    if replaced or nbytes > len(mapping):
        _close(mapping)
        return None
    return mapping


def _map(path: str, size: int, *, writable: bool) -> mmap.mmap | None:
    """Copy-on-write (for the restore), or shared and writable (for the snapshots)."""
    try:
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None  # not this process's to write: the client maps for itself, as without
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        if writable:
            return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        return mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):
        return None  # it shrank or went between the stat and the map: the next look maps it
    finally:
        os.close(fd)


def _close(mapping: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):  # a view still holds it: unmapped when that goes
        mapping.close()


_premap: Premap | None = None


def wait(fd: int) -> None:
    """The bootstrap's call, once its ``ready`` is said: this rank's slots (``ENV`` names
    their directory; it leaves the environment the program sees) mapped and kept current
    until the go (or EOF) is waiting on ``fd``."""
    global _premap  # noqa: PLW0603 - one per process, like the bootstrap's own state
    directory = os.environ.pop(ENV, "")
    if not directory:
        return
    try:
        _premap = Premap(directory, os.environ.get("RANK", ""))
    except ValueError:  # no usable RANK: nothing to map, the go is read as without
        return
    _premap.wait(fd)


def take(path: str, nbytes: int) -> mmap.mmap | None:
    """``Premap.take`` of this process's premap (what the client calls)."""
    return None if _premap is None else _premap.take(path, nbytes)


def take_writable(slot: int) -> tuple[str, mmap.mmap] | None:
    """``Premap.take_writable`` of this process's premap (what the client calls)."""
    return None if _premap is None else _premap.take_writable(slot)


def release() -> None:
    """``Premap.release`` of this process's premap (what the client calls)."""
    if _premap is not None:
        _premap.release()
