"""NCCL Flight Recorder dumps: read as plain data only, summarised per process group.
The two dumps in tests/fixtures/flight were written by torch 2.11's ProcessGroupNCCL
(NCCL 2.28.9) on an H200 (scripts/gpu/capture.py --fault hang / timeout)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.flight import behind, enqueued, summarize
from supervisor.process.native import read_flight_dump

HERE = Path(__file__).resolve().parent.parent / "fixtures" / "flight"


def test_a_real_dump_says_which_collective_was_never_started_and_who_issued_it() -> None:
    for name, timeout in (("h200_hang_rank_0.pkl", 600000), ("h200_timeout_rank_0.pkl", 5000)):
        dump, why = read_flight_dump(HERE / name)
        assert why is None and dump["entries"][0]["timeout_ms"] == timeout
        (group,) = summarize(dump)
        assert group == {
            "group": "0", "desc": "default_pg", "ranks": "[0]", "enqueued": 1, "started": -1, "completed": -1,
            "pending": {"seq": 1, "op": "all_reduce", "state": "scheduled", "sizes": [[1024]],
                        "issued_at": "/work/main/scripts/gpu/faults.py:83 main"},
        }  # fmt: skip


class _Runs:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.marker,))


def test_a_dump_that_names_a_function_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = tmp_path / "evil"
    evil.write_bytes(pickle.dumps({"pg_status": {"0": _Runs(str(marker))}}))
    dump, why = read_flight_dump(evil)
    assert dump is None and why is not None and "names posix.mkdir" in why
    assert not marker.exists()


def test_a_torn_huge_or_missing_dump_is_a_reason_not_an_error(tmp_path: Path) -> None:
    real = (HERE / "h200_hang_rank_0.pkl").read_bytes()
    torn = tmp_path / "torn"
    torn.write_bytes(real[: len(real) // 2])
    assert read_flight_dump(torn)[0] is None and "not readable" in str(read_flight_dump(torn)[1])
    huge = tmp_path / "huge"
    huge.write_bytes(real)
    assert read_flight_dump(huge, limit=100) == (None, "the Flight Recorder dump is over 100 bytes")
    assert "cannot read" in str(read_flight_dump(tmp_path / "absent")[1])


def test_the_rank_that_issued_fewer_collectives_is_behind() -> None:
    def group(n: int) -> list[dict[str, Any]]:
        return [{"group": "0", "enqueued": n}, {"group": "7", "enqueued": 2},
                {"group": "9", "enqueued": None}]  # fmt: skip

    counts = {rank: enqueued(group(n)) for rank, n in ((0, 5), (1, 4), (2, 5))}
    assert counts[1] == {"0": 4, "7": 2}
    assert behind(counts) == {"0": ([1], 4, 5)}
    assert behind({0: enqueued(group(5)), 1: enqueued(group(5))}) == {}


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=30), inner, max_size=4)
        | st.tuples(inner, inner)
    ),
    max_leaves=30,
)


@settings(max_examples=80, deadline=None)  # each CI run draws anew
@given(st.dictionaries(st.sampled_from(["pg_config", "pg_status", "entries", "version"]), plain) | plain)
def test_any_plain_data_is_summarised_without_raising(dump: Any) -> None:
    groups = summarize(dump)
    behind({0: enqueued(groups), 1: enqueued(groups)})
