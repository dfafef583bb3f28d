"""The slot file of an in-memory snapshot (supervisor.client.snapshot_slots): a state
written into a slot file as the daemon sizes it reads back the same, torn or damaged
slots are refused, restored tensors are the rank's to modify; and the API without a
daemon (snapshot False, restore None)."""

from __future__ import annotations

import math
import mmap
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch
import xxhash

from supervisor.client import snapshot_slots as slotfile
from supervisor.client.snapshot_slots import HEADER_SIZE, MAGIC, SlotError
from tests.support import write_slot


def write(path: Path, state: Any, step: int, *, size: int | None = None) -> tuple[int, str]:
    """What a rank does: the daemon sized the file, the rank maps it, copies, checksums."""
    return write_slot(path, state, step, size=size)


def same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and b.dtype == a.dtype and b.shape == a.shape
        assert torch.equal(a.cpu(), b)
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and b.dtype == a.dtype and b.shape == a.shape
        assert np.array_equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert type(b) is type(a) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b)
    else:
        assert type(b) is type(a) and b == a


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]  # fmt: skip


def test_a_nested_state_round_trips(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(7)
    base = torch.randn(6, 8, generator=g)
    state = {
        "model": {
            f"w_{d}".replace("torch.", ""): (torch.randn(5, 3, generator=g) * 10).to(d) for d in DTYPES
        },
        "views": {
            "transposed": base.t(),  # non-contiguous
            "strided": base[::2, 1::3],
            "scalar": torch.tensor(3.25),  # 0-d
            "scalar_bf16": torch.tensor(1.5, dtype=torch.bfloat16),
            "empty": torch.empty(0),
            "empty_2d": torch.zeros(0, 4, dtype=torch.int64),
            "expanded": torch.arange(3.0).expand(4, 3),
        },
        "optim": {
            "state": {0: {"step": torch.tensor(12.0), "exp_avg": torch.randn(3, generator=g)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1], "nesterov": False}],
        },
        "loader": {"epoch": 2, "position": 12345, "seed": 2**63 + 5, "huge": 3**50, "name": "shard-ü"},
        "rng": {
            "python": (3, tuple(range(5)), None),
            "numpy": ("MT19937", np.arange(4, dtype=np.uint32), 2, 0, 0.5),
            "torch": torch.get_rng_state(),
        },
        "odd": {
            "nan": float("nan"),
            "inf": float("inf"),
            "-inf": -float("inf"),
            "blob": b"\x00\xff",
            "__tensor__": "a user's key that looks like a marker",
            "np_scalar": np.float32(2.5),
            (1, 2): "a tuple key",
        },
        "none": None,
        "flags": [True, False, 0, 1.0],
    }
    total, digest = write(tmp_path / "rank0.0", state, 41)
    step, back, mapping = slotfile.read_slot(str(tmp_path / "rank0.0"), total, digest, 41)
    assert step == 41
    expected = dict(state)
    expected["odd"] = dict(state["odd"], np_scalar=np.asarray(np.float32(2.5)))  # held as a 0-d array
    same(expected, back)
    assert isinstance(back["optim"]["state"], dict) and 0 in back["optim"]["state"]  # int keys stay ints
    assert mapping.closed is False


def test_the_layout_is_the_protocols(tmp_path: Path) -> None:
    t = torch.arange(10, dtype=torch.int16)
    total, _ = write(tmp_path / "s", {"a": t, "b": [1, "x"]}, 9)
    raw = (tmp_path / "s").read_bytes()
    assert raw[:8] == MAGIC
    length, data_offset, step = (int.from_bytes(raw[o : o + 8], "little") for o in (8, 16, 24))
    assert step == 9 and data_offset % 64 == 0 and data_offset >= HEADER_SIZE + length
    skeleton = orjson.loads(raw[HEADER_SIZE : HEADER_SIZE + length])
    entry = skeleton["a"]
    assert entry == {"__tensor__": 0, "dtype": "int16", "shape": [10], "offset": 0, "nbytes": 20}
    assert skeleton["b"] == [1, "x"]
    assert raw[data_offset : data_offset + 20] == t.numpy().tobytes()
    assert total == data_offset + 64  # 20 bytes, the data area aligned to 64


def test_offsets_are_aligned(tmp_path: Path) -> None:
    p = slotfile.plan(
        {"a": torch.ones(3, dtype=torch.int8), "b": torch.ones(5), "c": torch.ones(1, dtype=torch.float64)}
    )
    assert [a.offset for a in p.arrays] == [0, 64, 128]
    assert p.data_offset % 64 == 0 and p.total == p.data_offset + 192


def test_restored_tensors_are_views_the_rank_may_modify(tmp_path: Path) -> None:
    state = {"w": torch.ones(1000), "n": np.ones(8)}
    total, digest = write(tmp_path / "slot", state, 1)
    _, back, mapping = slotfile.read_slot(str(tmp_path / "slot"), total, digest, 1)
    back["w"].add_(1)  # copy-on-write: the file stays as it was
    back["n"] += 1
    assert float(back["w"][0]) == 2.0
    assert slotfile.checksum((tmp_path / "slot").read_bytes(), total) == digest
    _, again, _ = slotfile.read_slot(str(tmp_path / "slot"), total, digest, 1)
    assert float(again["w"][0]) == 1.0 and again["n"][0] == 1.0
    # no second copy: the tensor's memory is the mapping's
    address = np.frombuffer(mapping, dtype=np.uint8).ctypes.data
    assert address <= back["w"].data_ptr() < address + len(mapping)


def test_make_private_keeps_restored_tensors_when_the_slot_is_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "rank0.1"
    total, digest = write(path, {"w": torch.full((3000,), 5.0)}, 3)
    _, back, mapping = slotfile.read_slot(str(path), total, digest, 3)
    slotfile.make_private(mapping)
    write(path, {"w": torch.full((3000,), 9.0)}, 5, size=total)  # the next snapshot in this slot
    assert torch.equal(back["w"], torch.full((3000,), 5.0))


def test_without_make_private_the_file_shows_through(tmp_path: Path) -> None:
    # why make_private exists: pages of a private mapping not yet written show the file
    path = tmp_path / "rank0.1"
    total, digest = write(path, {"w": torch.full((3000,), 5.0)}, 3)
    _, back, _ = slotfile.read_slot(str(path), total, digest, 3)
    write(path, {"w": torch.full((3000,), 9.0)}, 5, size=total)
    assert float(back["w"][0]) == 9.0


def test_a_slot_larger_than_the_snapshot(tmp_path: Path) -> None:
    state = {"w": torch.arange(100.0)}
    total, digest = write(tmp_path / "s", state, 2, size=1 << 20)  # grown by an earlier, larger one
    _, back, _ = slotfile.read_slot(str(tmp_path / "s"), total, digest, 2)
    same(state, back)


@pytest.mark.parametrize("damage", ["torn", "flipped", "short", "other_step", "wrong_checksum"])
def test_a_torn_or_damaged_slot_is_refused(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "rank0.0"
    state = {"w": torch.randn(4096), "step": 7}
    total, digest = write(path, state, 7)
    step = 7
    if damage == "torn":  # a copy cut off: the tail of the tensors still the old bytes
        with path.open("r+b") as f:
            f.seek(total // 2)
            f.write(bytes(total - total // 2))
    elif damage == "flipped":
        with path.open("r+b") as f:
            f.seek(total - 3)
            byte = f.read(1)
            f.seek(total - 3)
            f.write(bytes([byte[0] ^ 1]))
    elif damage == "short":
        os.truncate(path, total - 1)
    elif damage == "other_step":
        step = 8
    else:
        digest = "0" * 16
    with pytest.raises(SlotError) as refused:
        slotfile.read_slot(str(path), total, digest, step)
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)


def test_a_bad_header_under_a_good_checksum_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    total, _ = write(path, {"w": torch.ones(4)}, 1)
    raw = bytearray(path.read_bytes())
    raw[:8] = b"NOTASNAP"
    path.write_bytes(raw)
    with pytest.raises(SlotError, match="not a snapshot slot"):
        slotfile.read_slot(str(path), total, slotfile.checksum(raw, total), 1)
    raw[:8] = MAGIC
    raw[16:24] = (total + 64).to_bytes(8, "little")  # the data area past the end
    path.write_bytes(raw)
    with pytest.raises(SlotError, match="does not fit"):
        slotfile.read_slot(str(path), total, slotfile.checksum(raw, total), 1)


def test_a_tensor_entry_out_of_bounds_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    total, _ = write(path, {"w": torch.ones(4)}, 1)
    raw = bytearray(path.read_bytes())
    length = int.from_bytes(raw[8:16], "little")
    skeleton = raw[HEADER_SIZE : HEADER_SIZE + length]
    assert b'"nbytes":16' in skeleton
    # the same length, so the header still fits
    for before, after, why in (
        (b'"nbytes":16', b'"nbytes":99', "out of bounds"),
        (b'"offset":0', b'"offset":8', "misaligned"),
    ):
        changed = bytearray(raw)
        changed[HEADER_SIZE : HEADER_SIZE + length] = skeleton.replace(before, after)
        path.write_bytes(changed)
        with pytest.raises(SlotError, match=why):
            slotfile.read_slot(str(path), total, slotfile.checksum(changed, total), 1)


def test_a_plan_larger_than_the_slot_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "s"
    path.write_bytes(bytes(128))
    p = slotfile.plan({"w": torch.ones(100)})
    writer = slotfile.Writer(slotfile.map_for_writing(str(path), 128))
    with pytest.raises(SlotError, match="holds 128"):
        writer.write(p, 1)
    writer.close()
    with pytest.raises(SlotError, match="fewer than"):
        slotfile.map_for_writing(str(path), p.total)


def test_values_that_cannot_be_held_are_named() -> None:
    with pytest.raises(TypeError, match=r"state\['x'\]\['y'\]: a object"):
        slotfile.plan({"x": {"y": object()}})
    with pytest.raises(TypeError, match="dense tensors only"):
        slotfile.plan({"s": torch.eye(3).to_sparse()})
    loop: dict[str, Any] = {}
    loop["me"] = loop
    with pytest.raises(TypeError, match="refers to itself"):
        slotfile.plan(loop)
    with pytest.raises(TypeError, match="must be a mapping"):
        slotfile.plan([1, 2])  # type: ignore[arg-type]


def test_the_checksum_is_xxh3_64_of_the_first_bytes() -> None:
    data = bytes(range(256)) * 10
    assert slotfile.checksum(data, 1000) == xxhash.xxh3_64_hexdigest(data[:1000])
    assert len(slotfile.checksum(data, 1000)) == 16


def test_a_state_without_tensors_needs_no_torch(tmp_path: Path) -> None:
    # torch and numpy made unimportable: the client imports, and a plain state round-trips
    code = """
import sys
sys.modules["torch"] = None
sys.modules["numpy"] = None
from pathlib import Path
import supervisor.client
from supervisor.client import snapshot_slots as s
state = {"step": 3, "pos": [1, 2.5, "x", None], "t": (1, 2), "k": {4: "int key"}}
p = s.plan(state)
path = Path(sys.argv[1])
path.write_bytes(bytes(p.total))
w = s.Writer(s.map_for_writing(str(path), p.total))
w.write(p, 3)
digest = s.checksum(w.mapping, p.total)
step, back, _ = s.read_slot(str(path), p.total, digest, 3)
assert step == 3 and back == state, back
print("ok")
"""
    argv = [sys.executable, "-c", code, str(tmp_path / "plain")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_without_a_daemon_snapshot_is_false_and_restore_none(tmp_path: Path) -> None:
    code = """
import os, warnings
os.environ.pop("FT_SUPERVISOR_RANKS_ENDPOINT", None)
warnings.simplefilter("ignore")
from supervisor import client
assert client.snapshot({"a": 1}, 0) is False
assert client.restore() is None
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FT_SUPERVISOR")}
    argv = [sys.executable, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_restored_mapping_of_a_page_multiple(tmp_path: Path) -> None:
    # a slot exactly a few pages long: make_private touches every page, the last included
    n = (3 * mmap.PAGESIZE - 128) // 4
    state = {"w": torch.arange(n, dtype=torch.float32)}
    total, digest = write(tmp_path / "s", state, 1)
    _, back, mapping = slotfile.read_slot(str(tmp_path / "s"), total, digest, 1)
    slotfile.make_private(mapping)
    same(state, back)


def test_a_slot_is_sealed_only_once_its_copy_is_whole(tmp_path: Path) -> None:
    # what the daemon reads of a rank gone before its done: the header's seal, written last
    from supervisor.core.memory_snapshots import HEADER, sealed  # noqa: PLC0415

    p = slotfile.plan({"w": bytes(range(200)) * 50, "step": 7})
    path = tmp_path / "rank0.0"
    path.write_bytes(bytes(p.total))
    mapping = slotfile.map_for_writing(str(path), p.total)
    assert sealed(bytes(mapping[:HEADER_SIZE])) is None  # never written
    writer = slotfile.Writer(mapping)
    writer.write(p, 7)
    assert sealed(bytes(mapping[:HEADER_SIZE])) == (7, p.total)
    # the next copy's first store, the header of step 8: the seal of step 7 no longer holds
    mapping[: HEADER.size] = HEADER.pack(MAGIC, len(p.skeleton), p.data_offset, 8)
    assert sealed(bytes(mapping[:HEADER_SIZE])) is None
    writer.write(p, 8)
    assert sealed(bytes(mapping[:HEADER_SIZE])) == (8, p.total)
    assert sealed(b"FTSNAP01" + bytes(56)) is None and sealed(b"short") is None
    writer.close()
