"""Issue 25's done-when on one node: a real 2-rank DDP job (gloo, CPU) with ~100 MB of
state per rank (model and Adam) snapshots every step through the real daemon; rank 1 is
SIGKILLed mid-step; the daemon restarts the ranks, both restore the same step (at most
one lost) with the very parameters they held at that step before the kill, bit for bit
(checksums the ranks recorded after each step), and the job completes.

The rank script: tests/fixtures/ranks/ddp_snapshots.py. The daemon's bookkeeping on
virtual time: tests/fast/test_held_snapshots.py; torch-free real-process cases:
tests/integration/test_memory_snapshots.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import RANKS, Daemon

DDP_SNAPSHOTS = str(RANKS / "ddp_snapshots.py")
Start = Callable[..., Daemon]
pytestmark = [pytest.mark.torch, pytest.mark.slow]
STEPS, KILL_AT = 8, 4  # rank 1 dies in step 5, after step 4's snapshot
GPU = Path("/dev/nvidiactl").exists()  # looked at without importing torch


def _sums(out: Path, gen: int, rank: int) -> dict[int, str]:
    lines = (out / f"sums.g{gen}.r{rank}").read_text().splitlines()
    return {int(step): digest for step, digest in (line.split() for line in lines)}


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not GPU, reason="no GPU on this machine"))],
)
def test_a_sigkilled_ddp_rank_resumes_from_memory_bit_for_bit(
    start: Start, tmp_path: Path, device: str
) -> None:
    # on cuda the state's copies from the device are asynchronous (supervisor/client/snapshot_cuda.py)
    out = tmp_path / "out"
    out.mkdir()
    d = start("--nproc-per-node", "2", "--max-restarts", "1", DDP_SNAPSHOTS, "--steps", str(STEPS),
              "--out", str(out), "--kill-at", str(KILL_AT), "--device", device)  # fmt: skip
    assert d.wait(180) == 0, d.story()
    before = [_sums(out, 0, rank) for rank in (0, 1)]
    # the kill landed mid-run: both ranks completed the step before it, neither the next
    assert [max(sums) for sums in before] == [KILL_AT, KILL_AT], before
    assert before[0] == before[1]  # DDP: the same parameters on both ranks after every step
    restored = [json.loads((out / f"restored.g1.r{rank}.json").read_text()) for rank in (0, 1)]
    steps = {r["step"] for r in restored}
    assert len(steps) == 1, restored  # both ranks restore one step
    (step,) = steps
    # the SIGKILL may cut off the done of rank 1's last snapshot (checksummed in the background)
    assert step in (KILL_AT - 1, KILL_AT), restored
    # bit for bit what each rank held at that step before the kill
    assert [r["sum"] for r in restored] == [before[0][step], before[1][step]], (restored, before)
    assert d.events("snapshot_restored") and {
        (e["rank"], e["step"], e["source"]) for e in d.events("snapshot_restored")
    } == {(0, step, "memory"), (1, step, "memory")}
    # resumed from the next step, and completed on both ranks with the same parameters
    after = [_sums(out, 1, rank) for rank in (0, 1)]
    assert [min(sums) for sums in after] == [step + 1, step + 1], after
    done = [json.loads((out / f"done.r{rank}.json").read_text()) for rank in (0, 1)]
    assert done[0] == done[1] and done[0]["step"] == STEPS - 1, done
