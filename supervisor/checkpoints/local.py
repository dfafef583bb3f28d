"""Checkpoints on a local or mounted filesystem: scanning LOCAL, copying files, and
DEST as a directory (``LocalStore``).

A file is copied under a temporary name, fsync'ed, given the source's modification
time, then renamed into place; a directory entry is built whole under a temporary
name (every file fsync'ed, then the directories) and renamed into place at the end,
and the parent directory is fsync'ed after each rename. A rename is atomic on a
POSIX filesystem (NFS included), so at DEST every name is either a complete entry
or absent: the directory listing itself says what is complete, and the manifest
only adds the signatures the entries had in LOCAL (a filesystem with coarser
timestamps would otherwise make every entry look changed).

Copies run in the checkpoint threads a chunk at a time (``aiofiles.os.sendfile``: the
kernel moves the bytes; a read/write fallback where a filesystem refuses it), so the
loop never waits on the disk and a cancellation lands within a chunk.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from concurrent.futures import Executor
from pathlib import Path

import aiofiles.os
import orjson

from supervisor.checkpoints.store import CHUNK, Check, EntryChanged, Maker, later, off, pid_alive, verify
from supervisor.clock import SYSTEM
from supervisor.core.snapshots import (
    FOREIGN_TEMP_MAX_AGE_S,
    MANIFEST,
    Entry,
    FileStat,
    ManifestError,
    entries_from_json,
    entry,
    is_leftover,
    is_reserved,
    manifest_json,
    parse_temp,
)

_NO_SENDFILE = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV)

# -- scanning (blocking: called in the checkpoint threads) ---------------------------


def scan_tree(root: Path) -> dict[str, Entry]:
    """LOCAL's (or a DEST directory's) entries; a missing directory has none."""
    out: dict[str, Entry] = {}
    try:
        listing = os.scandir(root)
    except FileNotFoundError:
        return out
    with listing:
        for item in listing:
            if is_reserved(item.name):
                continue
            found = scan_entry(root / item.name)
            if found is not None:
                out[item.name] = found
    return out


def scan_entry(path: Path) -> Entry | None:
    """One entry's signature, or None when it is gone or is no file nor directory.
    Symbolic links are followed for the entry and its files, not for directories
    inside it (a link to ``..`` would never end)."""
    try:
        st = path.stat()
    except OSError:
        return None
    if stat.S_ISREG(st.st_mode):
        return entry(path.name, "file", [FileStat("", st.st_size, st.st_mtime_ns)])
    if not stat.S_ISDIR(st.st_mode):
        return None
    files = []
    for dirpath, _, filenames in os.walk(path):
        for filename in filenames:
            full = Path(dirpath, filename)
            try:
                fst = full.stat()
            except OSError:
                continue  # removed meanwhile, or a dangling link
            if stat.S_ISREG(fst.st_mode):
                files.append(FileStat(full.relative_to(path).as_posix(), fst.st_size, fst.st_mtime_ns))
    return entry(path.name, "dir", files)


class Pinned:
    """A file entry held open (``snapshots.hold``): the file its name pointed to then,
    which stays whole whatever happens to the name. It is copied through
    ``/proc/self/fd``, so both kinds of DEST read it as they read any path."""

    def __init__(self, path: Path, since_ns: int) -> None:
        self.since_ns = since_ns
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.name = path.name
        found = self.now()
        if found is None:
            os.close(self.fd)
            raise EntryChanged(f"{path}: no longer a file")
        self.entry: Entry = found

    @property
    def source(self) -> Path:
        return Path(f"/proc/self/fd/{self.fd}")

    def now(self) -> Entry | None:
        """Its signature now: a change since it was opened means somebody wrote to it."""
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return entry(self.name, "file", [FileStat("", st.st_size, st.st_mtime_ns)])

    def close(self) -> None:
        os.close(self.fd)


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def place_new(tmp: Path, final: Path) -> None:
    """Rename a complete copy into place, never over an existing name. (A check, then a
    rename: while the copy-back runs, no rank runs the script, so nobody else writes.)"""
    if final.exists() or final.is_symlink():
        raise FileExistsError(errno.EEXIST, "already in LOCAL, kept", str(final))
    tmp.rename(final)
    fsync_dir(final.parent)


def leftovers(root: Path, maker: Maker) -> list[Path]:
    """Temporary names under ``root`` that no live copy is using."""
    now = SYSTEM.wall()
    found: list[Path] = []
    try:
        names = [p for p in root.iterdir() if p.name.startswith(".ft-tmp.")]
    except FileNotFoundError:
        return found
    for p in names:
        temp = parse_temp(p.name)
        if temp is None:
            continue
        try:
            age = now - p.lstat().st_mtime
        except FileNotFoundError:
            continue
        if is_leftover(
            temp, host=maker.host, pid=maker.pid, pid_alive=pid_alive(temp.pid), age_s=age,
            max_age_s=FOREIGN_TEMP_MAX_AGE_S,
        ):  # fmt: skip
            found.append(p)
    return found


def remove_leftovers(root: Path, maker: Maker) -> list[str]:
    gone = leftovers(root, maker)
    for p in gone:
        remove_path(p)
    return [p.name for p in gone]


# -- copying -------------------------------------------------------------------------


def _open_pair(src: Path, dst: Path, size: int) -> tuple[int, int]:
    """(source fd, new destination fd); EntryChanged when the source is not ``size`` long."""
    fin = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    fout = -1
    try:
        if os.fstat(fin).st_size == size:
            fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    finally:
        if fout < 0:
            os.close(fin)
    if fout < 0:
        raise EntryChanged(f"{src}: its size changed")
    return fin, fout


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


async def _pump(fin: int, fout: int, f: FileStat, *, src: Path, executor: Executor, chunk: int) -> None:
    offset, kernel = 0, True
    while offset < f.size:
        count = min(chunk, f.size - offset)
        if kernel:
            try:
                sent = await aiofiles.os.sendfile(fout, fin, offset, count, executor=executor)
            except OSError as exc:
                if exc.errno not in _NO_SENDFILE:
                    raise
                kernel = False
                continue
        else:
            data = await off(executor, os.pread, fin, count, offset)
            await off(executor, _write_all, fout, data)
            sent = len(data)
        if sent == 0:
            raise EntryChanged(f"{src}: shorter than it was")
        offset += sent
    await off(executor, os.fsync, fout)


async def copy_file(src: Path, dst: Path, f: FileStat, executor: Executor, chunk: int = CHUNK) -> None:
    """Copy ``f.size`` bytes to a new ``dst``, fsync it and give it ``f.mtime_ns``.
    EntryChanged when ``src`` is no longer that size (a writer is at it).

    Raw descriptors rather than aiofiles' file objects: those close (and flush) in
    ``__aexit__`` with an await, and on a hung mount that await would hold a cancelled
    copy, and the final sync's deadline with it. Here a failed or cancelled copy hands
    its close to a thread and goes."""
    fin, fout = await off(executor, _open_pair, src, dst, f.size)
    try:
        await _pump(fin, fout, f, src=src, executor=executor, chunk=chunk)
    except BaseException:
        later(executor, _close, fin, fout)
        raise
    await off(executor, _close, fin, fout)
    await off(executor, os.utime, dst, ns=(f.mtime_ns, f.mtime_ns))


async def copy_entry(e: Entry, src: Path, dst: Path, executor: Executor, chunk: int = CHUNK) -> None:
    """Copy a whole entry to a new path ``dst``, every file and directory fsync'ed."""
    if e.kind == "file":
        await copy_file(src, dst, e.files[0], executor, chunk)
        return
    await aiofiles.os.mkdir(dst, executor=executor)
    made = {dst}
    for f in e.files:
        target = dst / f.path
        for parent in reversed(target.relative_to(dst).parents[:-1]):
            if dst / parent not in made:
                await aiofiles.os.makedirs(dst / parent, exist_ok=True, executor=executor)
                made.add(dst / parent)
        await copy_file(src / f.path, target, f, executor, chunk)
    for d in sorted(made, key=lambda p: len(p.parts), reverse=True):
        await off(executor, fsync_dir, d)


# -- DEST as a directory ---------------------------------------------------------------


class LocalStore:
    def __init__(self, root: Path, *, executor: Executor, chunk: int = CHUNK, maker: Maker) -> None:
        self.root = root
        self.url = str(root)
        self.entries: dict[str, Entry] = {}
        self._executor = executor
        self._chunk = chunk
        self._maker = maker

    async def load(self) -> None:
        await aiofiles.os.makedirs(self.root, exist_ok=True, executor=self._executor)
        present = await off(self._executor, scan_tree, self.root)
        recorded = await off(self._executor, self._recorded)
        self.entries = {
            name: recorded[name] if name in recorded and recorded[name].same_shape(e) else e
            for name, e in present.items()
        }

    def _recorded(self) -> dict[str, Entry]:
        try:
            return entries_from_json(orjson.loads((self.root / MANIFEST).read_bytes()))
        except FileNotFoundError:
            return {}
        except (ManifestError, orjson.JSONDecodeError):
            return {}  # the listing is the truth here; the signatures come from it

    async def clean(self) -> list[str]:
        return await off(self._executor, remove_leftovers, self.root, self._maker)

    async def put(self, e: Entry, source: Path, check: Check) -> None:
        tmp = self.root / self._maker.temp(e.name)
        try:
            await copy_entry(e, source, tmp, self._executor, self._chunk)
            await verify(check, e, source)
            await off(self._executor, self._swap, tmp, self.root / e.name)
        except Exception:
            await off(self._executor, remove_path, tmp)
            raise
        self.entries[e.name] = e
        await self._save_manifest()

    def _swap(self, tmp: Path, final: Path) -> None:
        if tmp.is_dir() or final.is_dir():
            # a directory cannot be renamed over a full one: the old goes aside first
            # (between the two renames the name is absent, never partial)
            aside = self.root / self._maker.temp(final.name)
            if final.exists() or final.is_symlink():
                final.rename(aside)
            tmp.rename(final)
            fsync_dir(self.root)
            remove_path(aside)
        else:
            tmp.replace(final)
            fsync_dir(self.root)

    async def get(self, e: Entry, target: Path) -> None:
        await copy_entry(e, self.root / e.name, target, self._executor, self._chunk)

    async def delete(self, name: str) -> None:
        self.entries.pop(name, None)
        await self._save_manifest()
        aside = self.root / self._maker.temp(name)

        def remove() -> None:
            try:
                (self.root / name).rename(aside)  # gone at once, as a whole
            except FileNotFoundError:
                return
            fsync_dir(self.root)
            remove_path(aside)

        await off(self._executor, remove)

    async def _save_manifest(self) -> None:
        data = orjson.dumps(manifest_json(self.entries), option=orjson.OPT_INDENT_2)
        await off(self._executor, write_atomically, self.root, MANIFEST, data, self._maker)


def write_atomically(root: Path, name: str, data: bytes, maker: Maker) -> None:
    tmp = root / maker.temp(name)
    try:
        with tmp.open("xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(root / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(root)
