"""A warm standby maps its rank's snapshot slots before its go (issue 25, item 2): the
bootstrap's premap (supervisor/process/bootstrap_premap.py, loaded as the bootstrap loads
it) maps this rank's two slot files while it waits, and the client's restore reads the slot
the daemon names from that mapping (``snapshots.read_held``), checked against what the
daemon recorded as any mapping is: a snapshot sealed into the slot after the premap is the
one read, a record the slot no longer holds is refused. Through a real daemon and real
standbys: tests/integration/test_memory_snapshots.py."""

from __future__ import annotations

import ctypes
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from supervisor.client import snapshot_slots as slotfile
from supervisor.client import snapshots
from supervisor.client.snapshot_slots import SlotError
from supervisor.core.topology import ENV_PREMAP
from supervisor.process import bootstrap
from tests.support import wait_until, write_slot

RANK = 3


def state(step: int, n: int = 50_000) -> dict[str, Any]:
    return {"w": np.arange(n, dtype=np.float64) * (step + 1), "step": step, "loader": [step, "x"]}


def write(path: Path, step: int, n: int = 50_000) -> tuple[int, str]:
    """What the rank does (the daemon sized the file): copy, seal, checksum."""
    return write_slot(path, state(step, n), step)


@pytest.fixture
def premap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """``start()``: what a standby's bootstrap does once it said ready, its go already
    waiting on the boot channel; the premap module, as the client finds it."""
    monkeypatch.setenv(ENV_PREMAP, str(tmp_path))
    monkeypatch.setenv("RANK", str(RANK))
    ours, theirs = socket.socketpair()
    loaded: list[ModuleType] = []

    def start() -> ModuleType:
        module = bootstrap._sibling("bootstrap_premap.py")  # the bootstrap's own loading
        ours.sendall(b'{"env": {}}\n')
        module.wait(theirs.fileno())  # maps, then returns: the go is there
        loaded.append(module)
        return module

    yield start
    for module in loaded:
        module.release()
    ours.close()
    theirs.close()
    assert snapshots.PREMAP not in sys.modules


def held_mapping(module: ModuleType, path: Path) -> Any:
    return module._premap.held[str(path)][0]


def test_the_restore_after_the_go_reads_the_slot_the_standby_mapped(premap: Any, tmp_path: Path) -> None:
    slot0, slot1 = tmp_path / f"rank{RANK}.0", tmp_path / f"rank{RANK}.1"
    nbytes, digest = write(slot0, 4)
    write(slot1, 5)
    write(tmp_path / f"rank{RANK + 1}.0", 5)  # another rank's: never mapped
    module = premap()
    assert ENV_PREMAP not in os.environ  # the program's environment is the one it was given
    assert set(module._premap.held) == {str(slot0), str(slot1)}
    mapped = held_mapping(module, slot0)
    step, back, mapping, served = snapshots.read_held(str(slot0), nbytes, digest, 4)
    assert (step, served) == (4, "premapped") and mapping is mapped  # not mapped again
    assert np.array_equal(back["w"], state(4)["w"]) and back["loader"] == [4, "x"]
    back["w"][0] = -1.0  # the rank's to modify: copy-on-write, the slot keeps step 4
    assert slotfile.read_slot(str(slot0), nbytes, digest, 4)[0] == 4
    # the other slot is unmapped (off the restore's path, in a thread), and the premap gone:
    # a second restore maps for itself
    wait_until(lambda: snapshots.PREMAP not in sys.modules and not module._premap.held, 10, "released")
    assert snapshots.read_held(str(slot0), nbytes, digest, 4)[3] == "mapped"


def test_a_snapshot_sealed_after_the_premap_is_the_one_restored(premap: Any, tmp_path: Path) -> None:
    slot0, slot1 = tmp_path / f"rank{RANK}.0", tmp_path / f"rank{RANK}.1"
    write(slot0, 4)
    write(slot1, 5)
    module = premap()
    mapped = held_mapping(module, slot0)
    # the dying rank's next snapshot, sealed into slot 0 after the standby mapped it
    nbytes, digest = write(slot0, 6)
    step, back, mapping, served = snapshots.read_held(str(slot0), nbytes, digest, 6)
    assert (step, served) == (6, "premapped") and mapping is mapped
    assert np.array_equal(back["w"], state(6)["w"]) and back["step"] == 6


def test_a_record_the_premapped_slot_no_longer_holds_is_refused(premap: Any, tmp_path: Path) -> None:
    slot0 = tmp_path / f"rank{RANK}.0"
    nbytes, digest = write(slot0, 4)
    premap()
    write(slot0, 6)  # overwritten since the daemon recorded step 4
    with pytest.raises(SlotError, match="checksum"):  # never step 4's record over step 6's bytes
        snapshots.read_held(str(slot0), nbytes, digest, 4)


def test_a_slot_file_that_grew_after_the_last_look_is_mapped_again(premap: Any, tmp_path: Path) -> None:
    slot0 = tmp_path / f"rank{RANK}.0"
    write(slot0, 4)
    module = premap()
    first = len(held_mapping(module, slot0))
    nbytes, digest = write(slot0, 7, n=200_000)  # a bigger state: the file grew
    assert nbytes > first
    module._premap.refresh()  # its next look (every REFRESH_S while it waits, and at the go)
    assert len(held_mapping(module, slot0)) == nbytes
    step, back, _, served = snapshots.read_held(str(slot0), nbytes, digest, 7)
    assert (step, served) == (7, "premapped") and np.array_equal(back["w"], state(7, n=200_000)["w"])


def _smaps_of(mapping: Any) -> tuple[str, int]:
    """The permissions of ``mapping``'s range in /proc/self/smaps and its resident kB
    (pages mapped in this process's page tables: populated, not just in the file)."""
    cell = ctypes.c_char.from_buffer(mapping)
    start = ctypes.addressof(cell)
    del cell  # the buffer export, released: the mapping can be closed again
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        span, _, rest = line.partition(" ")
        if "-" in span and int(span.split("-")[0], 16) == start:
            rss = next(int(x.split()[1]) for x in lines[i + 1 :] if x.startswith("Rss:"))
            return rest.split()[0], rss
    raise AssertionError(f"no mapping at {start:#x}")


def test_the_standby_maps_both_slots_shared_and_writable_their_pages_populated(
    premap: Any, tmp_path: Path
) -> None:
    slot0, slot1 = tmp_path / f"rank{RANK}.0", tmp_path / f"rank{RANK}.1"
    write(slot0, 4, n=300_000)
    write(slot1, 5, n=300_000)
    write(tmp_path / f"rank{RANK + 1}.0", 5)  # another rank's: never mapped, for writing least of all
    module = premap()
    assert set(module._premap.writable) == {str(slot0), str(slot1)}
    for path in (slot0, slot1):
        mapping = module._premap.writable[str(path)][0]
        perms, rss_kb = _smaps_of(mapping)
        # shared (the file's pages: what the rank writes there is the slot), and every page in
        # the page tables already: the first snapshot after the go faults none in
        assert perms == "rw-s" and rss_kb * 1024 >= len(mapping) > 2_000_000, (perms, rss_kb)
        assert bytes(mapping[:8]) == b"FTSNAP01"  # not a byte changed by populating


def test_the_first_snapshots_after_the_go_write_through_the_standbys_mappings(
    premap: Any, tmp_path: Path
) -> None:
    slot0, slot1 = tmp_path / f"rank{RANK}.0", tmp_path / f"rank{RANK}.1"
    nbytes, digest = write(slot0, 4)
    write(slot1, 5)
    module = premap()
    writable = {p: module._premap.writable[str(p)][0] for p in (slot0, slot1)}
    mine = snapshots._Snapshots(client=None)  # type: ignore[arg-type]  # no round trip: the writers only
    mine.adopt()  # what restore() and the first snapshot() do first
    assert snapshots.read_held(str(slot0), nbytes, digest, 4)[3] == "premapped"
    for number, path in enumerate((slot0, slot1)):
        p = slotfile.plan(state(10 + number))
        writer = mine._writer(mine.slots[number], str(path), p.total)
        assert writer.mapping is writable[path] and mine.slots[number].via == "premapped"
        writer.write(p, 10 + number)  # the rank's copy, through the standby's mapping, lands in the file
        total, got = p.total, slotfile.checksum(writer.mapping, p.total)
        step, back, mapping, _ = snapshots.read_held(str(path), total, got, 10 + number)
        assert step == 10 + number and np.array_equal(back["w"], state(10 + number)["w"])
        slotfile._drop(mapping)
    for slot in mine.slots:
        assert slot.writer is not None
        slot.writer.close()


def test_a_slot_file_replaced_since_the_premap_is_mapped_again_for_writing(
    premap: Any, tmp_path: Path
) -> None:
    slot0 = tmp_path / f"rank{RANK}.0"
    write(slot0, 4)
    premap()
    slot0.unlink()  # another file at the same path: the standby's mapping is not that file's
    write(slot0, 6)
    mine = snapshots._Snapshots(client=None)  # type: ignore[arg-type]
    mine.adopt()
    p = slotfile.plan(state(8))
    writer = mine._writer(mine.slots[0], str(slot0), p.total)
    assert mine.slots[0].via == "mapped"
    writer.write(p, 8)
    assert slotfile.read_slot(str(slot0), p.total, slotfile.checksum(writer.mapping, p.total), 8)[0] == 8
    writer.close()
