"""Where checkpoints are kept (DEST): the interface both kinds of destination offer.

A plain path (or a ``file://`` URL) is a directory on a local or mounted filesystem
(``local.LocalStore``, no extra package). Any other scheme (``s3://``, ``gs://``,
``memory://``...) goes through fsspec (``remote.FsspecStore``), the optional extra
``ft-supervisor[fsspec]`` plus the scheme's own package (s3fs, gcsfs...).

Both keep DEST a plain mirror of LOCAL's entries, readable without ft-supervisor
(an entry script may simply ``cp DEST/snapshot.pth``), plus ``.ft-checkpoints.json``,
the manifest: each complete entry with its signature. Both write a new or changed
entry under a temporary name first (``.ft-tmp.<pid>.<tag>.<host>.<entry>``), then put
it in place, so no reader ever finds half a checkpoint under an entry's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from supervisor.core.snapshots import Entry, temp_name

T = TypeVar("T")
CHUNK = 16 << 20  # one thread hop per chunk; bounds how late a cancellation lands
# how a sync reads an entry's signature again, after copying it
Check = Callable[[], Awaitable[Entry | None]]


class EntryChanged(Exception):
    """The entry was written to while it was being copied; the copy is dropped
    (a state rather than a failure: the entry is tried again at the next sync)."""


async def verify(check: Check, e: Entry, source: Path) -> None:
    """EntryChanged unless the source still has the signature it was copied with."""
    if await check() != e:
        raise EntryChanged(f"{source}: written to while it was copied")


class Store(Protocol):
    url: str
    entries: dict[str, Entry]  # the complete entries at DEST, as this process knows them

    async def load(self) -> None:
        """Read what DEST holds (once, at start: afterwards ``entries`` is kept up to date)."""

    async def clean(self) -> list[str]:
        """Remove leftover temporary names (crashed or cancelled syncs); return them."""

    async def put(self, entry: Entry, source: Path, check: Check) -> None:
        """Copy ``entry`` from ``source`` and put it in place at DEST, or raise
        EntryChanged (DEST unchanged) when ``check`` no longer returns ``entry``."""

    async def get(self, entry: Entry, target: Path) -> None:
        """Copy ``entry`` from DEST to ``target`` (a fresh path), times preserved."""

    async def delete(self, name: str) -> None:
        """Remove an entry from DEST, as a whole."""


@dataclass(frozen=True, slots=True)
class Maker:
    """Who writes temporary names: this host and process."""

    host: str
    pid: int

    @classmethod
    def here(cls) -> Maker:
        return cls(socket.gethostname(), os.getpid())

    def temp(self, entry_name: str) -> str:
        return temp_name(entry_name, host=self.host, pid=self.pid, tag=secrets.token_hex(4))


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # somebody else's process
    return True


async def off(executor: Executor, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    """``fn(*args, **kwargs)`` in one of the checkpoint threads."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor, functools.partial(fn, *args, **kwargs))


def later(executor: Executor, fn: Callable[..., object], *args: object) -> None:
    """``fn(*args)`` in a checkpoint thread, not waited for (cleanup on a path that must
    not block: a cancelled copy, a missed deadline)."""
    with contextlib.suppress(RuntimeError):  # shut down: the process is ending anyway
        executor.submit(fn, *args)
