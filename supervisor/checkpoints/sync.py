"""The checkpoint syncer the daemon runs: copy-back at start, a sync every period,
and a last sync when the run ends.

- Copy-back: before generation 0's ranks run the script (they preload meanwhile),
  the newest complete entry at DEST is copied into LOCAL under a temporary name and
  renamed into place, unless LOCAL has it or something newer
  (``snapshots.restore_choice``), bounded by ``--checkpoint-restore-timeout``. LOCAL
  is never overwritten nor pruned.
- Every ``--checkpoint-frequency``: the entries of LOCAL that DEST lacks or holds
  with another signature are uploaded (``snapshots.plan``), newest first, once no
  file of theirs was written for the settle time; an entry written to while it was
  being copied is dropped at DEST and tried again next time. The settle time is a
  file's: a busy file entry's file is held open, and uploaded once it went unwritten
  for the settle time, though its writer renamed another over its name meanwhile
  (``snapshots.hold``). Then retention prunes DEST beyond ``--checkpoint-keep``.
- When the run ends, whatever the outcome (a SIGTERM included), after the ranks are
  gone: one more sync, without the settle time (no rank is left to write), bounded
  by ``--checkpoint-final-timeout``.

A sync that fails is an event (``checkpoint_sync_failed``), tried again next
period, never fatal to the run. A copy-back that fails (DEST unreachable, LOCAL
full) lets the ranks start with what LOCAL has; that run then never prunes DEST,
since what it would delete may be the only good checkpoint. DEST is read once, at
start; afterwards this process keeps its own account of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Mapping, Sequence

from supervisor.checkpoints.local import (
    Pinned,
    place_new,
    remove_leftovers,
    remove_path,
    scan_entry,
    scan_tree,
)
from supervisor.checkpoints.store import EntryChanged, Maker, Store, later, off
from supervisor.checkpoints.stores import open_store
from supervisor.checkpoints.threads import DaemonThreads
from supervisor.clock import SYSTEM
from supervisor.config.checkpoints import CheckpointConfig
from supervisor.core.catalogue.checkpoints import (
    CheckpointPruned,
    CheckpointRestored,
    CheckpointRestoreSkipped,
    CheckpointSynced,
    CheckpointSyncFailed,
)
from supervisor.core.snapshots import Entry, hold, plan, restore_choice, to_prune
from supervisor.core.types import EventSink

MAX_HELD = 64  # busy file entries held open at once (a file descriptor each)


class CheckpointSync:
    """A no-op without ``--checkpoint-path`` (``cfg`` None)."""

    def __init__(
        self,
        cfg: CheckpointConfig | None,
        events: EventSink,
        *,
        chunk: int | None = None,
        store: Store | None = None,  # DEST, when not the one ``cfg.url`` names
        executor: DaemonThreads | None = None,
    ) -> None:
        self.cfg = cfg
        self.events = events
        # set once the copy-back is over (or not needed): generation 0 waits for it
        self.restored = asyncio.Event()
        self._executor = executor or DaemonThreads()
        self._maker = Maker.here()
        self._chunk = chunk
        self._given = store
        self._store: Store | None = None
        self._lock = asyncio.Lock()
        self._may_prune = True
        # busy file entries held open, a file each (``snapshots.hold``); a replaced file
        # keeps its disk space until it is copied or let go
        self._held: dict[str, Pinned] = {}

    async def run(self) -> None:
        """The copy-back, then a sync every period (a task of the daemon's TaskGroup)."""
        cfg = self.cfg
        if cfg is None:
            self.restored.set()
            return
        try:
            async with asyncio.timeout(cfg.restore_timeout):
                await self._restore(cfg)
        except Exception as exc:
            self._may_prune = False
            error = (f"the copy-back did not finish within {cfg.restore_timeout:g}s"
                     if isinstance(exc, TimeoutError) else _describe(exc))  # fmt: skip
            self.events.emit(CheckpointSyncFailed(phase="restore", error=error, dest=cfg.url), logging.ERROR)
        finally:
            self.restored.set()
        while True:
            await SYSTEM.sleep(cfg.frequency)
            # never cut short when the run ends (final() waits for it on the lock): a
            # cancel between a prune's manifest and its removal would leave the pruned
            # entry at DEST under its real name
            await asyncio.shield(self.sync(final=False))

    async def final(self, *, ranks_gone: bool = True) -> None:
        """The last sync, bounded by ``--checkpoint-final-timeout``. Once the ranks are
        gone nothing is still being written, so the settle time does not apply (a rank's
        last checkpoint, written just before it exited, is the one that matters)."""
        cfg = self.cfg
        if cfg is None:
            return
        try:
            async with asyncio.timeout(cfg.final_timeout):
                await self.sync(final=True, settle=not ranks_gone)
        except TimeoutError:
            error = f"the last sync did not finish within {cfg.final_timeout:g}s"
            self.events.emit(CheckpointSyncFailed(phase="final", error=error, dest=cfg.url), logging.ERROR)
        finally:
            self._executor.shutdown()

    async def sync(self, *, final: bool, settle: bool = True) -> bool:
        """One sync; False when it failed (reported, not raised)."""
        assert self.cfg is not None
        async with self._lock:
            try:
                await self._sync(self.cfg, final=final, settle=settle)
            except Exception as exc:
                phase = "final" if final else "periodic"
                self.events.emit(CheckpointSyncFailed(phase=phase, error=_describe(exc), dest=self.cfg.url))
                return False
        return True

    def _open(self, cfg: CheckpointConfig) -> Store:
        if self._given is not None:
            return self._given
        kw = {} if self._chunk is None else {"chunk": self._chunk}
        return open_store(cfg.url, self._executor, maker=self._maker, **kw)

    async def _restore(self, cfg: CheckpointConfig) -> None:
        ex = self._executor
        await off(ex, cfg.path.mkdir, parents=True, exist_ok=True)  # the ranks may expect it
        store = self._open(cfg)
        await store.load()
        self._store = store
        await off(ex, remove_leftovers, cfg.path, self._maker)  # our own half-restored copies
        local = await off(ex, scan_tree, cfg.path)
        choice = restore_choice(local, store.entries)
        if choice.entry is None:
            self.events.emit(CheckpointRestoreSkipped(reason=choice.reason, dest=cfg.url,
                                                      local=sorted(local) or None))  # fmt: skip
            return
        e, started = choice.entry, SYSTEM.monotonic()
        tmp = cfg.path / self._maker.temp(e.name)
        try:
            await store.get(e, tmp)
            await off(ex, place_new, tmp, cfg.path / e.name)
        except BaseException:
            later(ex, remove_path, tmp)  # not waited for: a cancel must not wait on DEST
            raise
        seconds = round(SYSTEM.monotonic() - started, 3)
        self.events.emit(CheckpointRestored(entry=e.name, files=len(e.files), bytes=e.bytes, seconds=seconds,
                                            source=cfg.url))  # fmt: skip

    async def _sync(self, cfg: CheckpointConfig, *, final: bool, settle: bool) -> None:
        started, ex = SYSTEM.monotonic(), self._executor
        if self._store is None:  # DEST was unreachable at start
            store = self._open(cfg)
            await store.load()
            self._store = store
        store = self._store
        await store.clean()
        local = await off(ex, scan_tree, cfg.path)
        settle_ns = int(cfg.settle * 1e9) if settle else 0
        todo = plan(local, store.entries, now_ns=SYSTEM.wall_ns(), settle_ns=settle_ns, keep=cfg.keep)
        sent, busy = await self._from_held(store, cfg, local, todo.busy, settle_ns)
        for name in todo.upload:
            e, path = local[name], cfg.path / name
            try:
                await store.put(e, path, functools.partial(off, ex, scan_entry, path))
            except EntryChanged:
                busy.append(name)
                continue
            sent.append(e)
        pruned = to_prune(store.entries, cfg.keep) if self._may_prune else ()
        for name in pruned:
            await store.delete(name)
        if pruned:
            self.events.emit(CheckpointPruned(entries=list(pruned), dest=cfg.url, keep=cfg.keep))
        if sent or busy or final:
            self.events.emit(
                CheckpointSynced(
                    entries=[e.name for e in sent],
                    files=sum(len(e.files) for e in sent),
                    bytes=sum(e.bytes for e in sent),
                    seconds=round(SYSTEM.monotonic() - started, 3),
                    dest=cfg.url,
                    final=final,
                    busy=sorted(busy) or None,
                )
            )

    async def _from_held(
        self, store: Store, cfg: CheckpointConfig, local: Mapping[str, Entry], busy: Sequence[str],
        settle_ns: int,
    ) -> tuple[list[Entry], list[str]]:  # fmt: skip
        """Busy file entries: hold each one's file open, and upload a file held
        unwritten for the settle time (``snapshots.hold``); what was uploaded, and
        the names still busy."""
        ex = self._executor
        for name in [n for n in self._held if n not in busy]:  # settled, or gone
            later(ex, self._held.pop(name).close)
        sent: list[Entry] = []
        waiting: list[str] = []
        for name in busy:
            held = self._held.get(name)
            what = "again" if held is None else hold(
                held.entry, await off(ex, held.now), since_ns=held.since_ns, now_ns=SYSTEM.wall_ns(),
                settle_ns=settle_ns, dest=store.entries.get(name),
            )  # fmt: skip
            if held is not None and what != "wait":
                del self._held[name]
                if what == "copy" and await self._put_held(store, held):
                    sent.append(held.entry)
            if what != "wait" and local[name].kind == "file" and len(self._held) < MAX_HELD:
                with contextlib.suppress(OSError, EntryChanged):  # gone, or no longer a file
                    self._held[name] = await off(ex, Pinned, cfg.path / name, SYSTEM.wall_ns())
            if not sent or sent[-1].name != name:
                waiting.append(name)
        return sent, waiting

    async def _put_held(self, store: Store, held: Pinned) -> bool:
        ex = self._executor
        try:
            await store.put(held.entry, held.source, functools.partial(off, ex, held.now))
        except EntryChanged:
            return False
        finally:
            later(ex, held.close)  # not waited for: a hung mount must not hold a cancel
        return True


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
