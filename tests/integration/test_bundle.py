"""A hang's diagnostic bundle, left before the kill: every live rank's Python and
native stacks (py-spy), the Flight Recorder where the process group has one, and
what the daemon knew of each rank; reason.json points to it. Here what needs real
processes (py-spy on gloo ranks, torch's pipe); a bundle that cannot be written and the
user's own Flight Recorder settings: tests/fast/test_hangs.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.process.native import py_spy
from tests.support import RANKS, Daemon

Start = Callable[..., Daemon]


def _bundle(d: Daemon) -> tuple[Path, dict]:  # type: ignore[type-arg]
    (event,) = d.events("hang_bundle")
    path = Path(event["path"])
    return path, json.loads((path / "bundle.json").read_text())


@pytest.mark.skipif(py_spy() is None, reason="py-spy is not installed (the diagnostics extra)")
@pytest.mark.torch
def test_a_hang_in_a_gloo_job_leaves_native_stacks_of_every_rank_before_the_kill(start: Start) -> None:
    """Rank 1 sleeps in its own code while rank 0 waits in all_reduce: the native
    stacks show rank 0 inside c10d's wait (what faulthandler alone cannot say of a
    rank stuck in C++), rank 1 in its own function. gloo has no watchdog to answer
    the dump pipe: each rank's client dumps its Flight Recorder from a thread of its
    own (supervisor.client.flight), and that decides the blame (rank 1 issued one
    all_reduce fewer). The run ends on the hang, so reason.json names the bundle."""
    d = start("--nproc-per-node", "2", "--no-standby", "--max-restarts", "0",
              "--ft-rank-heartbeat-timeout", "1", str(RANKS / "collective_hang.py"))  # fmt: skip
    assert d.wait(120) != 0, d.story()
    path, manifest = _bundle(d)
    assert manifest["hung"] == [1] and manifest["waiting"] == [0]
    assert manifest["blamed_by"] == "flight_recorder", manifest["evidence"]
    by_rank = {r["rank"]: r for r in manifest["ranks"]}
    assert by_rank[0]["where"] == "collective" and by_rank[1]["where"] == "own"
    assert all(r["native_error"] is None and r["iteration"] == 4 for r in by_rank.values()), manifest
    assert "c10d::Work::wait" in (path / by_rank[0]["native_stacks"]).read_text()
    assert "stuck_in_own_code" in (path / by_rank[1]["native_stacks"]).read_text()
    assert "stuck_in_own_code" in (path / by_rank[1]["python_stacks"]).read_text()
    # gloo's dumps, made in the ranks: rank 0 waits in all_reduce #6, rank 1 issued 5
    assert all(r["flight_recorder"] and r["flight_recorder_error"] is None for r in by_rank.values())
    assert manifest["flight_recorder_behind"] == {"0": [1]}, manifest["flight_recorder_behind"]
    (group,) = by_rank[0]["flight_recorder_summary"]
    assert (group["enqueued"], group["pending"]["op"]) == (6, "gloo:all_reduce"), group
    # before the kill: the hung rank was SIGKILLed after the bundle was taken
    order = [e["event"] for e in d.events() if e["event"] in ("hang_bundle", "rank_exited")]
    assert order[0] == "hang_bundle", order
    reason = json.loads((d.run_dir() / "reason.json").read_text())  # type: ignore[operator]
    assert reason["bundle"] == str(path) and reason["rule"] == "HANG"


def test_the_flight_recorder_is_asked_for_its_dump_through_torchs_pipe(start: Start) -> None:
    """The daemon points TORCH_NCCL_DEBUG_INFO_PIPE_FILE / _TEMP_FILE into the
    generation's directory and, on a hang, writes to each rank's pipe as torch's
    watchdog expects; the dumps are in the bundle. A rank standing in for NCCL's
    watchdog answers (no NCCL without a GPU: checked against the protocol, not a GPU)."""
    d = start("--nproc-per-node", "2", "--preload", "none", "--no-standby", "--max-restarts", "1",
              "--ft-rank-heartbeat-timeout", "0.5", str(RANKS / "fr_pipe.py"))  # fmt: skip
    assert d.wait(60) == 0, d.story()
    assert "[rank 0] buffer 2000" in d.stdout()
    path, manifest = _bundle(d)
    dumps = {r["rank"]: r["flight_recorder"] for r in manifest["ranks"]}
    assert set(dumps) == {0, 1} and all(dumps.values()), manifest
    for dump in dumps.values():
        assert Path(dump).parent == path.parent  # the generation's directory
    # read (as plain data) and summarised: rank 0 waits in the all_reduce #4 that rank 1 never issued
    assert manifest["flight_recorder_behind"] == {"0": [1]}
    summary = {r["rank"]: r["flight_recorder_summary"] for r in manifest["ranks"]}
    assert [g["enqueued"] for g in summary[1]] == [3] and summary[1][0]["pending"] is None
    (group,) = summary[0]
    assert (group["desc"], group["enqueued"], group["completed"]) == ("default_pg", 4, 3)
    assert group["pending"]["op"] == "all_reduce" and group["pending"]["state"] == "scheduled"
    assert group["pending"]["issued_at"].endswith("fr_pipe.py:60 main")
    assert d.events("hang_bundle")[0]["flight_recorder_behind"] == {"0": [1]}
    # and the blame took it: both ranks sleep in their own code, but rank 1 never issued #4
    (hung,) = d.events("rank_hung")
    assert (hung["rank"], hung["blamed_by"]) == (1, "flight_recorder"), hung
    assert manifest["blamed_by"] == "flight_recorder" and manifest["hung"] == [1]
    reason = json.loads((d.run_dir() / "reason.json").read_text())  # type: ignore[operator]
    assert reason["last_failure"]["bundle"] == str(path)
