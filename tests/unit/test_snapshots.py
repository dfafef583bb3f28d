"""Checkpoint sync decisions: pure, with time as a parameter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core import snapshots as s
from supervisor.core.snapshots import Entry, FileStat, ManifestError

SEC = 1_000_000_000


def f(name: str, mtime_s: float, size: int = 10) -> Entry:
    return s.entry(name, "file", [FileStat("", size, int(mtime_s * SEC))])


def d(name: str, *files: tuple[str, int, float]) -> Entry:
    return s.entry(name, "dir", [FileStat(p, size, int(t * SEC)) for p, size, t in files])


def by_name(*entries: Entry) -> dict[str, Entry]:
    return {e.name: e for e in entries}


# -- what a sync uploads -------------------------------------------------------------


def test_new_and_changed_entries_are_uploaded_newest_first_unchanged_ones_not() -> None:
    local = by_name(f("a", 10), f("b", 30), f("c", 20, size=11))
    dest = by_name(f("a", 10), f("c", 20))
    p = s.plan(local, dest, now_ns=100 * SEC, settle_ns=2 * SEC, keep=None)
    assert p.upload == ("b", "c")
    assert p.busy == () and p.beyond_keep == ()


def test_an_entry_written_within_the_settle_time_waits_unless_final() -> None:
    local = by_name(f("old", 10), d("step_2", ("model.pt", 5, 10), ("optim.pt", 5, 99.5)))
    p = s.plan(local, {}, now_ns=100 * SEC, settle_ns=2 * SEC, keep=None)
    assert p.upload == ("old",)
    assert p.busy == ("step_2",)
    final = s.plan(local, {}, now_ns=100 * SEC, settle_ns=0, keep=None)
    assert final.upload == ("step_2", "old")


def test_an_entry_retention_would_prune_at_once_is_not_sent() -> None:
    local = by_name(f("step_1", 1), f("step_2", 2), f("step_3", 3))
    dest = by_name(f("step_4", 4))
    p = s.plan(local, dest, now_ns=100 * SEC, settle_ns=0, keep=2)
    assert p.upload == ("step_3",)
    assert p.beyond_keep == ("step_1", "step_2")


def test_an_older_local_version_never_replaces_a_newer_one_at_dest() -> None:
    local = by_name(f("snapshot.pth", 5, size=1), f("new", 6))
    dest = by_name(f("snapshot.pth", 9, size=2))
    p = s.plan(local, dest, now_ns=100 * SEC, settle_ns=0, keep=None)
    assert p.upload == ("new",) and p.older == ("snapshot.pth",)


def test_retention_prunes_the_oldest_beyond_k() -> None:
    dest = by_name(f("a", 3), f("b", 1), f("c", 2), d("e", ("x", 1, 5)))
    assert s.to_prune(dest, 2) == ("b", "c")
    assert s.to_prune(dest, 4) == ()
    assert s.to_prune(dest, None) == ()


def test_newest_is_the_entry_with_the_newest_file_ties_by_name() -> None:
    entries = [d("step_1", ("a", 1, 5), ("b", 1, 50)), f("snap", 40), f("z", 50)]
    assert [e.name for e in s.newest_first(entries)] == ["z", "step_1", "snap"]


names = st.sampled_from(["a", "b", "c", "d", "e", "f"])
entries = st.builds(f, names, st.integers(1, 20), st.integers(0, 3))
views = st.lists(entries, max_size=6).map(lambda es: by_name(*es))


@given(local=views, dest=views, keep=st.none() | st.integers(1, 4), now=st.integers(0, 25))
def test_a_sync_then_retention_keeps_the_k_newest_and_sends_nothing_twice(
    local: dict[str, Entry], dest: dict[str, Entry], keep: int | None, now: int
) -> None:
    p = s.plan(local, dest, now_ns=now * SEC, settle_ns=2 * SEC, keep=keep)
    assert not set(p.upload) & set(p.busy)
    assert all(dest.get(n) != local[n] for n in p.upload)  # only what changed
    assert all(s.settled(local[n], now * SEC, 2 * SEC) for n in p.upload)
    after = {**dest, **{n: local[n] for n in p.upload}}
    pruned = s.to_prune(after, keep)
    kept = {n: e for n, e in after.items() if n not in pruned}
    if keep is not None:
        assert len(kept) == min(keep, len(after))
        assert not set(p.upload) & set(pruned)  # nothing sent only to be deleted
    newest = [e.name for e in s.newest_first(after.values())][: keep or len(after)]
    assert set(kept) == set(newest)
    # the same sync again has nothing left to send
    again = s.plan(local, kept, now_ns=now * SEC, settle_ns=2 * SEC, keep=keep)
    assert again.upload == ()


# -- what the copy-back restores -----------------------------------------------------


def test_copy_back_restores_the_newest_entry_into_an_empty_local() -> None:
    dest = by_name(f("step_1", 1), f("step_2", 2))
    choice = s.restore_choice({}, dest)
    assert choice.entry is not None and choice.entry.name == "step_2" and choice.reason == "restore"


def test_copy_back_never_overwrites_and_respects_a_newer_local() -> None:
    dest = by_name(f("step_1", 1), f("snapshot.pth", 5))
    assert s.restore_choice(by_name(f("snapshot.pth", 3)), dest).reason == "local_has_it"
    assert s.restore_choice(by_name(f("step_9", 9)), dest).reason == "local_newer"
    assert s.restore_choice(by_name(f("step_0", 0)), dest).reason == "restore"  # a stale leftover
    assert s.restore_choice(by_name(f("x", 1)), {}).reason == "dest_empty"


# -- names and the manifest ----------------------------------------------------------


@given(
    name=st.text(st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1),
    host=st.text(min_size=0, max_size=20),
    pid=st.integers(1, 1 << 22),
)
def test_temporary_names_carry_their_maker_and_entry(name: str, host: str, pid: int) -> None:
    t = s.parse_temp(s.temp_name(name, host=host, pid=pid, tag="0a1b"))
    assert t is not None and t.pid == pid and t.entry == name
    assert s.is_reserved(t.name)


def test_leftover_temporary_names() -> None:
    t = s.parse_temp(s.temp_name("e", host="node1.example", pid=42, tag="ab"))
    assert t is not None
    mine = {"host": "node1.example", "max_age_s": 3600.0}
    assert s.is_leftover(t, pid=42, pid_alive=True, age_s=1.0, **mine)  # our own cancelled copy
    assert s.is_leftover(t, pid=7, pid_alive=False, age_s=1.0, **mine)  # a crashed sync here
    assert not s.is_leftover(t, pid=7, pid_alive=True, age_s=1.0, **mine)  # a live one here
    other = {"host": "node2", "max_age_s": 3600.0, "pid": 42, "pid_alive": False}
    assert not s.is_leftover(t, age_s=10.0, **other)  # another node's copy in progress
    assert not s.is_leftover(t, age_s=None, **other)
    assert s.is_leftover(t, age_s=7200.0, **other)  # abandoned long ago


@given(st.lists(st.one_of(entries, st.builds(d, names, st.just(("sub/x.pt", 3, 4.0)))), max_size=5))
def test_manifest_round_trips(es: list[Entry]) -> None:
    table = by_name(*es)
    assert s.entries_from_json(s.manifest_json(table)) == table


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"version": 9, "entries": {}}, "not a version 1"),
        ({"version": 1}, "no entries table"),
        ({"version": 1, "entries": {"../x": {"kind": "file", "files": [["", 1, 1]]}}}, "not a plain"),
        ({"version": 1, "entries": {".ft-x": {"kind": "file", "files": [["", 1, 1]]}}}, "not a plain"),
        ({"version": 1, "entries": {"x": {"kind": "link", "files": []}}}, "kind of file or dir"),
        ({"version": 1, "entries": {"x": {"kind": "dir", "files": [["../../etc", 1, 1]]}}}, "relative"),
        ({"version": 1, "entries": {"x": {"kind": "dir", "files": [["/etc/x", 1, 1]]}}}, "relative"),
        ({"version": 1, "entries": {"x": {"kind": "dir", "files": [["a", -1, 1]]}}}, "path, size"),
        ({"version": 1, "entries": {"x": {"kind": "file", "files": [["a", 1, 1]]}}}, "exactly one file"),
    ],
)
def test_a_manifest_that_cannot_be_trusted_is_refused(doc: object, problem: str) -> None:
    with pytest.raises(ManifestError, match=problem):
        s.entries_from_json(doc)


def test_a_held_file_unwritten_for_the_settle_time_is_copied_whatever_its_name_became() -> None:
    held = s.entry("snapshot.pth", "file", [FileStat("", 10, 5_000)])
    kw = {"since_ns": 1_000, "settle_ns": 2_000, "dest": None}
    assert s.hold(held, held, now_ns=2_999, **kw) == "wait"
    assert s.hold(held, held, now_ns=3_000, **kw) == "copy"


def test_a_held_file_written_to_is_let_go_and_held_again() -> None:
    held = s.entry("snapshot.pth", "file", [FileStat("", 10, 5_000)])
    grown = s.entry("snapshot.pth", "file", [FileStat("", 20, 6_000)])
    kw = {"since_ns": 1_000, "now_ns": 9_000, "settle_ns": 2_000, "dest": None}
    assert s.hold(held, grown, **kw) == "again"
    assert s.hold(held, None, **kw) == "again"  # no longer a regular file


def test_a_held_file_no_newer_than_dests_is_never_sent() -> None:
    held = s.entry("snapshot.pth", "file", [FileStat("", 10, 5_000)])
    newer = s.entry("snapshot.pth", "file", [FileStat("", 10, 7_000)])
    kw = {"since_ns": 1_000, "now_ns": 9_000, "settle_ns": 2_000}
    assert s.hold(held, held, dest=held, **kw) == "again"
    assert s.hold(held, held, dest=newer, **kw) == "again"
