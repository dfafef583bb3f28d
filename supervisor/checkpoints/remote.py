"""DEST through fsspec (``s3://``, ``gs://``, ``memory://``...): the optional extra.

On an object store a rename is a copy and a delete, file by file, so a directory
entry cannot appear at once. The manifest is the commit point instead: it is
written last, under a temporary name then moved (a single object: a PUT or a
server-side copy, atomic everywhere), and copy-back trusts only what it lists.
An entry's files are uploaded under a temporary name first; a changed entry is
first taken out of the manifest, then replaced, then listed again, so the manifest
never names an entry whose files are being rewritten. A crash leaves, at worst,
files the manifest does not name (temporary names are cleaned at the next sync;
an entry cut off between the manifest and its removal stays as plain files).

fsspec calls block; they run in the checkpoint threads, a chunk at a time.
"""

from __future__ import annotations

import os
from concurrent.futures import Executor
from datetime import datetime
from pathlib import Path
from typing import Any

import aiofiles
import aiofiles.os
import orjson

from supervisor.checkpoints.local import fsync_dir
from supervisor.checkpoints.store import CHUNK, Check, EntryChanged, Maker, later, off, pid_alive, verify
from supervisor.clock import SYSTEM
from supervisor.core.snapshots import (
    FOREIGN_TEMP_MAX_AGE_S,
    MANIFEST,
    TEMP,
    Entry,
    FileStat,
    entries_from_json,
    is_leftover,
    manifest_json,
    parse_temp,
)


def _age(info: dict[str, Any], now: float) -> float | None:
    """How old a listed object is, from whichever time field its filesystem gives."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created", "timeCreated"):
        value = info.get(key)
        if isinstance(value, int | float):
            return now - float(value)
        if isinstance(value, datetime):
            return now - value.timestamp()
    return None


class FsspecStore:
    def __init__(
        self, fs: Any, root: str, *, url: str, executor: Executor, chunk: int = CHUNK, maker: Maker
    ) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url
        self.entries: dict[str, Entry] = {}
        self._executor = executor
        self._chunk = chunk
        self._maker = maker

    def _path(self, *parts: str) -> str:
        return "/".join([self.root, *(p for p in parts if p)])

    async def load(self) -> None:
        try:
            raw = await off(self._executor, self.fs.cat_file, self._path(MANIFEST))
        except FileNotFoundError:
            self.entries = {}
            return
        self.entries = entries_from_json(orjson.loads(raw))

    async def clean(self) -> list[str]:
        try:
            listing = await off(self._executor, self.fs.ls, self.root, detail=True)
        except FileNotFoundError:
            return []
        now = SYSTEM.wall()
        gone = []
        for info in listing:
            name = str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
            temp = parse_temp(name) if name.startswith(TEMP) else None
            if temp is None or not is_leftover(
                temp, host=self._maker.host, pid=self._maker.pid, pid_alive=pid_alive(temp.pid),
                age_s=_age(info, now), max_age_s=FOREIGN_TEMP_MAX_AGE_S,
            ):  # fmt: skip
                continue
            await off(self._executor, self.fs.rm, self._path(name), recursive=True)
            gone.append(name)
        return gone

    async def put(self, e: Entry, source: Path, check: Check) -> None:
        tmp_name = self._maker.temp(e.name)
        tmp = self._path(tmp_name)
        try:
            for f in e.files:
                await self._upload(source / f.path if f.path else source, self._path(tmp_name, f.path), f)
            await verify(check, e, source)
        except Exception:
            await self._discard(tmp)
            raise
        final = self._path(e.name)
        if self.entries.pop(e.name, None) is not None:
            await self._save_manifest()  # no longer complete from here on
        if await off(self._executor, self.fs.exists, final):
            await off(self._executor, self.fs.rm, final, recursive=True)
        await off(self._executor, self.fs.mv, tmp, final, recursive=e.kind == "dir")
        self.entries[e.name] = e
        await self._save_manifest()

    async def _upload(self, src: Path, dst: str, f: FileStat) -> None:
        ex = self._executor
        async with aiofiles.open(src, "rb", executor=ex) as fin:
            await off(ex, self.fs.makedirs, dst.rsplit("/", 1)[0], exist_ok=True)
            out = await off(ex, self.fs.open, dst, "wb")
            sent = 0
            while sent < f.size:
                data = await fin.read(min(self._chunk, f.size - sent))
                if not data:
                    raise EntryChanged(f"{src}: shorter than it was")
                await off(ex, out.write, data)
                sent += len(data)
            # an abandoned (cancelled) upload is never closed: a multipart upload
            # then never completes, and a temporary name is cleaned later
            await off(ex, out.close)

    async def _discard(self, tmp: str) -> None:
        try:
            if await off(self._executor, self.fs.exists, tmp):
                await off(self._executor, self.fs.rm, tmp, recursive=True)
        except OSError:
            pass  # a leftover: cleaned at the next sync

    async def get(self, e: Entry, target: Path) -> None:
        ex = self._executor
        if e.kind == "dir":
            await aiofiles.os.mkdir(target, executor=ex)
        for f in e.files:
            dst = target / f.path if f.path else target
            await aiofiles.os.makedirs(dst.parent, exist_ok=True, executor=ex)
            src = await off(ex, self.fs.open, self._path(e.name, f.path), "rb")
            try:
                await self._download(src, dst, f, self._path(e.name, f.path))
            except BaseException:
                later(ex, src.close)  # not waited for: a stalled stream must not hold a cancel
                raise
            await off(ex, src.close)
            await off(ex, os.utime, dst, ns=(f.mtime_ns, f.mtime_ns))
        if e.kind == "dir":
            made = {p for f in e.files for p in (target / f.path).parents if p.is_relative_to(target)}
            for d in sorted(made, key=lambda p: len(p.parts), reverse=True):
                await off(ex, fsync_dir, d)

    async def _download(self, src: Any, dst: Path, f: FileStat, where: str) -> None:
        ex = self._executor
        async with aiofiles.open(dst, "xb", executor=ex) as out:
            got = 0
            while data := await off(ex, src.read, self._chunk):
                await out.write(data)
                got += len(data)
            if got != f.size:
                raise OSError(f"{where}: {got} bytes, the manifest says {f.size}")
            await out.flush()
            await off(ex, os.fsync, out.fileno())

    async def delete(self, name: str) -> None:
        if self.entries.pop(name, None) is not None:
            await self._save_manifest()  # uncommitted first: never listed while half gone
        final = self._path(name)
        if await off(self._executor, self.fs.exists, final):
            await off(self._executor, self.fs.rm, final, recursive=True)

    async def _save_manifest(self) -> None:
        data = orjson.dumps(manifest_json(self.entries), option=orjson.OPT_INDENT_2)
        tmp = self._path(self._maker.temp(MANIFEST))
        await off(self._executor, self.fs.pipe_file, tmp, data)
        await off(self._executor, self.fs.mv, tmp, self._path(MANIFEST))
