"""A snapshot's tensors on a CUDA device (supervisor/client/snapshot_cuda.py): copied into
the slot asynchronously, the slot sealed only once the copies are done, the copy ordered
on the device's stream (queued after the kernels that made the tensors, before an in-place
update queued after the call), every dtype and layout back bit for bit. Run where a GPU is
(the device machine); skipped elsewhere. The real-process case: test_snapshot_ddp's cuda
parameter."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.client import snapshot_slots as slotfile
from supervisor.core.memory_snapshots import HEADER, SEAL

pytestmark = pytest.mark.skipif(not Path("/dev/nvidiactl").exists(), reason="no GPU on this machine")
SPIN = 2_000_000_000  # GPU clock cycles: about a second of a kernel that only waits


@pytest.fixture
def torch() -> Any:
    import torch  # noqa: PLC0415 (not at collection: the suite's workers without a GPU never need it)

    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    return torch


@pytest.fixture
def shm() -> Iterator[Path]:
    """Where the daemon keeps slots: shared memory, which CUDA can page-lock (a disk file it cannot)."""
    path = Path(tempfile.mkdtemp(prefix="ft-test-cuda-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _writer(path: Path, p: slotfile.Plan) -> slotfile.Writer:
    with path.open("ab") as f:
        f.truncate(p.total)
    return slotfile.Writer(slotfile.map_for_writing(str(path), p.total))


def _seal(writer: slotfile.Writer) -> tuple[int, int]:
    return SEAL.unpack_from(writer.mapping, HEADER.size)  # type: ignore[return-value]


def test_the_copy_is_queued_behind_the_kernels_and_ahead_of_a_later_update(torch: Any, shm: Path) -> None:
    t = torch.full((1024, 1024), 1.0, device="cuda")
    state = {"w": t}
    p = slotfile.plan(state)
    writer = _writer(shm / "rank0.0", p)
    try:
        first = writer.write(p, 4)  # the first into a mapping page-locks it: CUDA waits for the device then
        assert first is not None
        first.wait()
        t.add_(0.0)  # the first launch of a kernel loads it (CUDA's lazy loading), waiting for the device
        torch.cuda.synchronize()
        began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began.record()
        torch.cuda._sleep(SPIN)  # the device is busy for ~1 s with work queued before the snapshot
        ended.record()
        t.add_(1.0)  # queued too: the snapshot must hold 2.0
        called = time.perf_counter()
        copying = writer.write(p, 5)
        call_ms = (time.perf_counter() - called) * 1000
        pending = not copying.done() if copying is not None else None
        t.add_(40.0)  # after the call: must not reach the slot
        assert copying is not None, "a CUDA tensor's copy was synchronous"
        assert writer.lock.address is not None and writer.lock.failure is None
        copying.wait()
        spin_ms = began.elapsed_time(ended)
        # the call returned while the device still spun: it did not wait for it
        assert call_ms < spin_ms / 2 and pending, (call_ms, spin_ms, pending)
        assert _seal(writer) == (0, 0), "sealed before the copy was done"
        writer.seal(p.total, 5)
        assert _seal(writer) == (6, p.total)
        digest = slotfile.checksum(writer.mapping, p.total)
        step, back, _ = slotfile.read_slot(str(shm / "rank0.0"), p.total, digest, 5)
        assert step == 5 and torch.equal(back["w"], torch.full((1024, 1024), 2.0))
        assert torch.equal(t.cpu(), torch.full((1024, 1024), 42.0))
    finally:
        writer.close()
    assert writer.lock.address is None


def test_every_dtype_and_layout_comes_back_bit_for_bit(torch: Any, shm: Path) -> None:
    g = torch.Generator(device="cuda").manual_seed(7)
    base = torch.randn(257, 129, device="cuda", generator=g)
    state = {
        "f32": base,
        "bf16": base.to(torch.bfloat16),
        "half": base.half()[::2],  # strided: made contiguous on the device first
        "transposed": base.t(),
        "int": torch.arange(1000, device="cuda", dtype=torch.int64),
        "scalar": torch.tensor(3.5, device="cuda"),
        "empty": torch.empty(0, 4, device="cuda"),
        "host": torch.arange(10.0),  # beside the device's: copied at once
        "step": 9,
    }
    p = slotfile.plan(state)
    path = shm / "rank0.1"
    writer = _writer(path, p)
    try:
        for step in (1, 2):  # the second into the same mapping: locked once
            copying = writer.write(p, step)
            assert copying is not None
            copying.wait()
            writer.seal(p.total, step)
        digest = slotfile.checksum(writer.mapping, p.total)
    finally:
        writer.close()
    _, back, _ = slotfile.read_slot(str(path), p.total, digest, 2)
    for key, value in state.items():
        if isinstance(value, int):
            assert back[key] == value
            continue
        got = back[key]
        assert got.device.type == "cpu" and got.dtype == value.dtype and got.shape == value.shape, key
        assert torch.equal(got, value.cpu()), key


def test_memory_cuda_cannot_lock_takes_a_synchronous_copy_and_leaves_no_error(
    torch: Any, tmp_path: Path
) -> None:
    # a file on disk: cudaHostRegister refuses it, and leaves the refusal as CUDA's last
    # error, which torch would raise from the training's next call unless it is cleared
    t = torch.arange(4096.0, device="cuda")
    p = slotfile.plan({"w": t})
    writer = _writer(tmp_path / "rank0.0", p)
    try:
        assert writer.write(p, 3) is None  # copied at once, sealed
        assert writer.lock.address is None and writer.lock.failure, writer.lock.failure
        assert _seal(writer) == (4, p.total)
        assert (t * 2).sum().item() == 4095.0 * 4096  # the device still works: no error left behind
        torch.cuda.synchronize()
        digest = slotfile.checksum(writer.mapping, p.total)
    finally:
        writer.close()
    _, back, _ = slotfile.read_slot(str(tmp_path / "rank0.0"), p.total, digest, 3)
    assert torch.equal(back["w"], t.cpu())
