"""Parse the torchelastic error file (``@record``) and pick the root cause.

The file is JSON written by ``torch.distributed.elastic.multiprocessing.errors``::

    {"message": {"message": "ValueError: boom",
                 "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1795268064"}},
     "errorCode": 1}

Older writers, and ranks that write it by hand, put a plain string in "message".
Anything else is treated as no error file, never as a crash of the supervisor.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from supervisor.core.types import ErrorRecord, RankFailure


def parse_error_file(text: str) -> ErrorRecord | None:
    try:
        data: Any = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    raw = data.get("message")
    error_code = _as_int(data.get("errorCode"))
    if isinstance(raw, str):
        return ErrorRecord(message=raw, error_code=error_code)
    if not isinstance(raw, dict):
        return None
    extra = raw.get("extraInfo")
    extra = extra if isinstance(extra, dict) else {}
    message = raw.get("message")
    callstack = extra.get("py_callstack")
    return ErrorRecord(
        message=message if isinstance(message, str) else "",
        traceback=callstack if isinstance(callstack, str) else "",
        timestamp=_as_int(extra.get("timestamp")),
        error_code=error_code,
    )


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _failure_key(failure: RankFailure) -> tuple[float, float]:
    # torchelastic orders failures by the timestamp inside the error file, which
    # has one-second resolution: useless when a peer's error follows within
    # milliseconds. The file's mtime says when @record fired, to the nanosecond;
    # a rank without one failed when it exited (we notice exits at once). A
    # rank that raised first but was slow to exit is still found first.
    return (failure.failed_at, failure.exit.at)


def root_cause(failures: Sequence[RankFailure]) -> RankFailure:
    """The earliest failure; the others are most likely its consequences."""
    if not failures:
        raise ValueError("root_cause() needs at least one failure")
    return min(failures, key=_failure_key)


def order_failures(failures: Sequence[RankFailure]) -> list[RankFailure]:
    return sorted(failures, key=_failure_key)
