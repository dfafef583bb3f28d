"""Lightning's ``snapshot_every_n_steps`` through the real daemon: a real Trainer (BoringModel,
DDP over gloo, 2 CPU ranks) snapshots every step and checkpoints to disk every 4; rank 1 is
SIGKILLed mid-fit; the restarted fit resumes from the memory snapshot, newer than the disk
checkpoint, with the parameters bit for bit as they were at that step. The choice itself
(``supervisor.core.resume_source``) is tested in tests/unit/test_resume_source.py."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import LIGHTNING_PRELOAD, RANKS, Daemon

if importlib.util.find_spec("lightning") is None:
    pytest.skip("lightning is not installed", allow_module_level=True)
pytestmark = pytest.mark.torch

Start = Callable[..., Daemon]
SCRIPT = str(RANKS / "lightning_snapshots.py")


def _records(out: Path, gen: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"g{gen}.r{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_a_killed_rank_resumes_from_memory_newer_than_disk(start: Start, tmp_path: Path) -> None:
    out, kill_at, max_steps = tmp_path / "out", 6, 8
    out.mkdir()
    d = start("--nproc-per-node", "2", "--max-restarts", "1", *LIGHTNING_PRELOAD, SCRIPT,
              "--out", str(out), "--ckpt-dir", str(tmp_path / "ckpt"), "--kill-at", str(kill_at),
              "--max-steps", str(max_steps))  # fmt: skip
    assert d.wait(timeout=120) == 0, d.story()
    assert [(e["generation"], e["action"]) for e in d.events("decision")] == [(0, "restart")], d.story()
    before, after = _records(out, 0), _records(out, 1)
    assert [r["start"] for r in before] == [[0, before[0]["start"][1]]] * 2
    starts = {tuple(r["start"]) for r in after}
    assert len(starts) == 1, after  # both ranks resume at the same step, with the same parameters
    ((step, digest),) = starts
    # a SIGKILL may cut off the last snapshot's done message (sent after the copy): one step back
    assert step in (kill_at - 1, kill_at), after
    assert digest == before[0]["steps"][str(step)] == before[1]["steps"][str(step)]
    # training goes on from the step after the snapshot, to the end
    assert all(sorted(map(int, r["steps"])) == list(range(step + 1, max_steps + 1)) for r in after), after
    line = (f"resuming at step {step} from memory: newer than the disk checkpoint "
            f"(memory snapshot at step {step}, disk checkpoint at step 4)")  # fmt: skip
    assert d.stderr().count(line) == 2, d.stderr()
    restored = d.events("snapshot_restored")
    assert {(e["rank"], e["step"], e["generation"]) for e in restored} == {(0, step, 1), (1, step, 1)}
