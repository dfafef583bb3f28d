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


def _failure(rank: int, at: float, wall: float, error_at: float | None = None) -> RankFailure:
    exit = RankExit(rank, rank, 100 + rank, ExitStatus(code=1), at=at, at_wall=wall)
    error = None if error_at is None else ErrorRecord(message=f"rank {rank}", timestamp=int(error_at))
    return RankFailure(exit, error, error_at=error_at)


def test_without_error_files_the_exit_order_decides() -> None:
    a = _failure(0, at=10.20, wall=1000.20)
    b = _failure(1, at=10.10, wall=1000.10)
    assert root_cause([a, b]) is b


def test_the_rank_that_raised_first_is_the_root_cause_even_if_it_exited_last() -> None:
    # rank 1 raised at .050 then hung in its teardown; rank 0 saw the peer's
    # connection close, raised at .051 and crashed at once: seen in a real run
    slow_culprit = _failure(1, at=12.0, wall=1002.0, error_at=1000.050)
    quick_victim = _failure(0, at=10.1, wall=1000.1, error_at=1000.051)
    assert root_cause([quick_victim, slow_culprit]) is slow_culprit
    assert order_failures([quick_victim, slow_culprit]) == [slow_culprit, quick_victim]


def test_an_error_file_beats_a_later_bare_exit() -> None:
    raised = _failure(0, at=10.30, wall=1000.30, error_at=1000.00)
    crashed = _failure(1, at=10.10, wall=1000.10)
    assert root_cause([crashed, raised]) is raised


def test_failure_time_is_never_after_the_exit() -> None:
    odd_clock = _failure(0, at=1.0, wall=1000.0, error_at=1005.0)
    assert odd_clock.failed_at == 1000.0


def test_root_cause_needs_a_failure() -> None:
    with pytest.raises(ValueError, match="at least one"):
        root_cause([])
