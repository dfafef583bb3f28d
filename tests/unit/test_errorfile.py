from pathlib import Path

import pytest

from supervisor.core.errorfile import order_failures, parse_error_file, root_cause
from supervisor.core.types import ErrorRecord, ExitStatus, RankExit, RankFailure

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "errorfiles"


def test_parses_the_file_torch_2_13_record_writes() -> None:
    record = parse_error_file((FIXTURES / "torch-2.13-record.json").read_text())
    assert record is not None
    assert record.message == "ValueError: boom from rank 1"
    assert "Traceback (most recent call last)" in record.traceback
    assert record.timestamp == 1795268064


def test_plain_string_message_and_error_code() -> None:
    record = parse_error_file('{"message": "Signal 6 (SIGABRT) received", "errorCode": 134}')
    assert record == ErrorRecord(message="Signal 6 (SIGABRT) received", error_code=134)


@pytest.mark.parametrize("text", ["", "not json", "[]", "42", '{"message": 3}', '{"other": 1}'])
def test_junk_is_no_error_file(text: str) -> None:
    assert parse_error_file(text) is None


def test_odd_fields_are_tolerated() -> None:
    record = parse_error_file('{"message": {"message": 5, "extraInfo": {"timestamp": "soon"}}}')
    assert record == ErrorRecord(message="")


def _failure(rank: int, at: float, wall: float, ts: int | None = None) -> RankFailure:
    exit = RankExit(rank, rank, 100 + rank, ExitStatus(code=1), at=at, at_wall=wall)
    error = None if ts is None else ErrorRecord(message=f"rank {rank}", timestamp=ts)
    return RankFailure(exit, error)


def test_within_one_second_the_exit_order_decides() -> None:
    a = _failure(0, at=10.20, wall=1000.20, ts=1000)
    b = _failure(1, at=10.10, wall=1000.10, ts=1000)
    assert root_cause([a, b]) is b


def test_an_error_file_can_prove_an_earlier_failure() -> None:
    # rank 0 failed at second 999 but only exited after rank 1
    a = _failure(0, at=10.30, wall=1000.30, ts=999)
    b = _failure(1, at=10.10, wall=1000.10)
    assert root_cause([a, b]) is a
    assert order_failures([b, a]) == [a, b]


def test_root_cause_needs_a_failure() -> None:
    with pytest.raises(ValueError, match="at least one"):
        root_cause([])
