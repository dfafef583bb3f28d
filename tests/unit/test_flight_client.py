"""The rank's side of a gloo Flight Recorder dump (supervisor.client.flight): where it
answers, and what a rank without a recorder answers (the daemon then stops waiting).
The dump of real gloo ranks: tests/integration/test_bundle.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from supervisor.client import flight
from supervisor.process.native import read_flight_dump


def test_the_fifo_and_the_dump_are_the_daemons_names_for_this_rank(tmp_path: Path) -> None:
    env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{tmp_path}/pipe_",
           "TORCH_FR_DUMP_TEMP_FILE": f"{tmp_path}/fr_"}  # fmt: skip
    assert flight.paths(env, 3) == (tmp_path / "pipe_3.fr.pipe", tmp_path / "fr_3")
    old = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "p", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "d"}
    assert flight.paths(old, 0) == (Path("p0.fr.pipe"), Path("d0"))
    assert flight.paths({}, 0) is None and flight.install({}, 0) is None


def test_a_rank_without_torch_says_so_and_the_daemon_reads_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    dump = tmp_path / "fr_0"
    flight._write(dump, flight._dump())
    assert read_flight_dump(dump) == (None, "torch is not loaded in this rank")
