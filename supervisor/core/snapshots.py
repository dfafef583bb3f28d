"""Checkpoint sync, the decisions: what changed, what to upload, keep, prune and restore.

A *checkpoint* is a top-level entry of the local checkpoint directory (LOCAL): a file
such as ``snapshot.pth`` or a directory such as ``step_000200/``. The destination
(DEST) mirrors entries one for one, and an entry is the unit of every decision: it is
uploaded, restored and pruned whole, never file by file, because a half of a
checkpoint is worth less than none (it loads, then fails, or worse, does not fail).

An entry is known by its *signature*: its kind and the size and ``mtime_ns`` of each
of its files. Copies keep the modification times, so a restored entry has the
signature it was uploaded with and is not sent back; and the same signature at DEST
and in LOCAL means "already there", without reading a byte. The newest entry is the
one with the newest file (ties broken by name): checkpoint writers name entries
``step_<n>`` or overwrite one ``snapshot.pth``, and either way the newest write is
the checkpoint to resume from.

The settle time applies to a file, not to a name. A file entry that does not settle
is held open; the file held is uploaded once it went unwritten for the settle time,
whatever became of its name meanwhile (``hold``). A writer that replaces its entry
by rename (a temporary file, fsync, renamed over the name) more often than the
settle time never lets the name settle, but each file it renames into place is
complete and never written again: the one held is uploaded. A file rewritten in
place keeps changing while held, and waits as before: a copy made in a pause of
its writer would be torn.

Names beginning with ``.ft-`` belong to ft-supervisor (temporary copies and the
manifest) and are never entries. Pure: time is a parameter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

RESERVED = ".ft-"
TEMP = ".ft-tmp."
MANIFEST = ".ft-checkpoints.json"
MANIFEST_VERSION = 1
# a writer that paused this long is taken to be done with its entry
SETTLE_S = 2.0
# another node's temporary copy is only taken for abandoned after this long
FOREIGN_TEMP_MAX_AGE_S = 24 * 3600.0

Kind = Literal["file", "dir"]


class ManifestError(ValueError):
    """A manifest (or an entry name in it) that cannot be trusted."""


@dataclass(frozen=True, slots=True, order=True)
class FileStat:
    path: str  # relative to the entry; "" when the entry is itself a file
    size: int
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    kind: Kind
    files: tuple[FileStat, ...]  # sorted by path

    @property
    def newest_ns(self) -> int:
        return max((f.mtime_ns for f in self.files), default=0)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def same_shape(self, other: Entry) -> bool:
        """The same kind, paths and sizes (times aside): how a copy that a filesystem
        stored with coarser timestamps is still recognised."""
        return self.kind == other.kind and [(f.path, f.size) for f in self.files] == [
            (f.path, f.size) for f in other.files
        ]


def entry(name: str, kind: Kind, files: Iterable[FileStat]) -> Entry:
    return Entry(name, kind, tuple(sorted(files)))


# -- names ---------------------------------------------------------------------------


def is_reserved(name: str) -> bool:
    return name.startswith(RESERVED)


def check_name(name: str) -> str:
    """An entry name from outside (a manifest): one harmless path component."""
    if not name or name in (".", "..") or "/" in name or "\0" in name or is_reserved(name):
        raise ManifestError(f"entry name {name!r} is not a plain file or directory name")
    return name


def check_path(path: str) -> str:
    """A file's path inside an entry: relative, with no way out of the entry."""
    parts = path.split("/")
    if path.startswith("/") or "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise ManifestError(f"file path {path!r} is not a plain relative path")
    return path


@dataclass(frozen=True, slots=True)
class Temp:
    """A temporary name: who made it (host and pid) and for which entry."""

    name: str
    host: str
    pid: int
    entry: str


def _host_part(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", host) or "host"


def temp_name(entry_name: str, *, host: str, pid: int, tag: str) -> str:
    """``.ft-tmp.<pid>.<tag>.<host>.<entry>``: the maker is in the name, so a later sync
    can tell its own (or a dead process's) leftovers from another node's copy in progress."""
    return f"{TEMP}{pid}.{tag}.{_host_part(host)}.{entry_name}"


def parse_temp(name: str) -> Temp | None:
    if not name.startswith(TEMP):
        return None
    parts = name[len(TEMP) :].split(".", 3)
    if len(parts) != 4 or not parts[0].isdigit():
        return Temp(name, "", -1, "")  # ours by prefix, maker unknown: only age tells
    return Temp(name, parts[2], int(parts[0]), parts[3])


def is_leftover(
    temp: Temp, *, host: str, pid: int, pid_alive: bool, age_s: float | None, max_age_s: float
) -> bool:
    """Whether a temporary name can be removed: this process's own (an upload that was
    cancelled), a dead process's on this host (a crashed sync), or anyone's once older
    than ``max_age_s`` (a node that never came back). A live copy elsewhere is left alone."""
    if temp.host == _host_part(host) and (temp.pid == pid or not pid_alive):
        return True
    return age_s is not None and age_s >= max_age_s


# -- decisions -----------------------------------------------------------------------


def newest_first(entries: Iterable[Entry]) -> list[Entry]:
    return sorted(entries, key=lambda e: (e.newest_ns, e.name), reverse=True)


def settled(e: Entry, now_ns: int, settle_ns: int) -> bool:
    """No file written for ``settle_ns``: its writer is most likely done with it."""
    return now_ns - e.newest_ns >= settle_ns


Hold = Literal["copy", "wait", "again"]


def hold(at_open: Entry, now: Entry | None, *, since_ns: int, now_ns: int, settle_ns: int,
         dest: Entry | None) -> Hold:  # fmt: skip
    """What to do with a file entry's file held open since ``since_ns``, whose signature
    was ``at_open`` then and is ``now`` now: ``copy`` it (unwritten for the settle time,
    and newer than DEST's), ``wait``, or let it go and hold what the name points to
    ``again`` (written to meanwhile, or no newer than DEST's)."""
    if now != at_open or (dest is not None and (dest == now or dest.newest_ns >= now.newest_ns)):
        return "again"
    return "copy" if now_ns - since_ns >= settle_ns else "wait"


@dataclass(frozen=True, slots=True)
class Plan:
    upload: tuple[str, ...]  # newest first: what a cut-short sync saves is the most useful
    busy: tuple[str, ...]  # changed, but written to within the settle time
    beyond_keep: tuple[str, ...]  # changed, but retention would delete it at once
    older: tuple[str, ...] = ()  # DEST holds a newer version: never replaced by an older one


def plan(
    local: Mapping[str, Entry],
    dest: Mapping[str, Entry],
    *,
    now_ns: int,
    settle_ns: int,
    keep: int | None,
) -> Plan:
    """What a sync uploads: each LOCAL entry that DEST lacks or holds with another
    signature, once settled (``settle_ns`` 0: the final sync, when no rank is left to
    write). An entry retention would delete right after is not sent at all, or a LOCAL
    that keeps every step would upload and prune the old ones on every sync. Nor is an
    entry whose DEST version is newer (a stale LOCAL on a node that kept its disk while
    the job went on elsewhere): DEST only ever moves forward."""
    differ = [e for e in local.values() if dest.get(e.name) != e]
    older = [e for e in differ if e.name in dest and dest[e.name].newest_ns > e.newest_ns]
    changed = [e for e in differ if e not in older]
    busy = [e for e in changed if not settled(e, now_ns, settle_ns)]
    ready = [e for e in changed if settled(e, now_ns, settle_ns)]
    beyond: list[Entry] = []
    while keep is not None:
        # an entry left out keeps its DEST version (if any), which may push another
        # out in turn: repeat until what is sent all survives (it only shrinks)
        after = {**dest, **{e.name: e for e in ready}}
        kept = {e.name for e in newest_first(after.values())[:keep]}
        if all(e.name in kept for e in ready):
            break
        beyond += [e for e in ready if e.name not in kept]
        ready = [e for e in ready if e.name in kept]
    return Plan(
        upload=tuple(e.name for e in newest_first(ready)),
        busy=tuple(sorted(e.name for e in busy)),
        beyond_keep=tuple(sorted(e.name for e in beyond)),
        older=tuple(sorted(e.name for e in older)),
    )


def to_prune(dest: Mapping[str, Entry], keep: int | None) -> tuple[str, ...]:
    """The complete entries at DEST beyond the ``keep`` newest, oldest first."""
    if keep is None:
        return ()
    return tuple(e.name for e in reversed(newest_first(dest.values())[keep:]))


@dataclass(frozen=True, slots=True)
class Restore:
    entry: Entry | None  # what to copy back into LOCAL; None: nothing
    reason: str  # restore | dest_empty | local_has_it | local_newer


def restore_choice(local: Mapping[str, Entry], dest: Mapping[str, Entry]) -> Restore:
    """What to copy back from DEST before the ranks start: its newest complete entry,
    unless LOCAL already has an entry of that name (LOCAL is never overwritten: a node
    that kept its disk has the same or a later write) or a newer one.

    Only the newest: the ranks resume from the newest checkpoint, every byte copied
    before they start delays them, and the older entries stay at DEST."""
    candidates = newest_first(dest.values())
    if not candidates:
        return Restore(None, "dest_empty")
    best = candidates[0]
    if best.name in local:
        return Restore(None, "local_has_it")
    newest_local = newest_first(local.values())
    if newest_local and (newest_local[0].newest_ns, newest_local[0].name) > (best.newest_ns, best.name):
        return Restore(None, "local_newer")
    return Restore(best, "restore")


# -- the manifest --------------------------------------------------------------------


def manifest_json(entries: Mapping[str, Entry]) -> dict[str, Any]:
    return {
        "version": MANIFEST_VERSION,
        "entries": {
            e.name: {"kind": e.kind, "files": [[f.path, f.size, f.mtime_ns] for f in e.files]}
            for e in newest_first(entries.values())
        },
    }


def entries_from_json(doc: object) -> dict[str, Entry]:
    """The entries a manifest lists; ManifestError for anything that does not fit."""
    if not isinstance(doc, dict) or doc.get("version") != MANIFEST_VERSION:
        raise ManifestError(f"not a version {MANIFEST_VERSION} checkpoint manifest")
    raw = doc.get("entries")
    if not isinstance(raw, dict):
        raise ManifestError("the manifest has no entries table")
    out: dict[str, Entry] = {}
    for name, body in raw.items():
        check_name(name)
        if not isinstance(body, dict) or body.get("kind") not in ("file", "dir"):
            raise ManifestError(f"entry {name!r}: expected a kind of file or dir")
        files = []
        for item in body.get("files", ()):
            if not (
                isinstance(item, list)
                and len(item) == 3
                and isinstance(item[0], str)
                and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in item[1:])
            ):
                raise ManifestError(f"entry {name!r}: a file must be [path, size, mtime_ns]")
            files.append(FileStat(item[0] if body["kind"] == "file" else check_path(item[0]), *item[1:]))
        if body["kind"] == "file" and [f.path for f in files] != [""]:
            raise ManifestError(f"entry {name!r}: a file entry has exactly one file, path ''")
        out[name] = entry(name, body["kind"], files)
    return out
