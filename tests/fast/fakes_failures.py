"""What the fast tier's failure cases share: a fake rank that fails the way
``tests/fixtures/ranks/fails.py`` does, and the daemon's console lines.

``fails(...)`` is that fixture's argument list as a script: one rank (of some
generations) says lines, reports iterations, raises, is killed by a signal or exits
with a code; the others wait in a collective until they are stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from supervisor.log import format_fields
from tests.fast.fakes import Rank, Script

LOGGER = "ft-supervisor.fast"  # the harness's daemon logger


def failing_trace(exc_type: str, message: str, causes: Sequence[tuple[str, str]] = ()) -> str:
    chained = "".join(
        f"{kind}: {text}\n\nThe above exception was the direct cause of the following exception:\n\n"
        for kind, text in causes
    )
    where = '  File "train.py", line 7, in <module>'
    return f"{chained}Traceback (most recent call last):\n{where}\n{exc_type}: {message}"


def fails(
    *, rank: int = 1, generations: Sequence[int] | None = None, say: Sequence[str] = (),
    iterations: int = 0, client: bool = False, exc: tuple[str, str] | None = None,
    causes: Sequence[tuple[str, str]] = (), error_file: bool = False, stuck: bool = False,
    kill: signal.Signals | None = None, exit: int | None = None,
) -> Script:  # fmt: skip
    """fails.py's behaviour: ``client`` reports the exception as the client's excepthook
    does; ``error_file`` writes torchelastic's error file first (``@record``); ``stuck``
    never exits after the failure (a teardown blocked on a peer)."""

    async def script(r: Rank) -> int | None:
        if client:
            r.hello()
            for i in range(iterations):
                r.send("iteration", iteration=i)
        if r.rank != rank or (generations is not None and r.generation not in generations):
            await r.hang()  # a peer blocked in a collective, until stopped
        for line in say:
            r.log(line)
        if kill is not None:
            return -kill
        if exit is not None:
            return exit
        if exc is not None:
            trace = failing_trace(*exc, causes=causes)
            r.log(trace)
            if error_file:
                message = f"{exc[0].rsplit('.', 1)[-1]}: {exc[1]}"
                error = {"message": {"message": message, "extraInfo": {"py_callstack": "", "timestamp": "0"}}}
                r.files.error_file.write_text(json.dumps(error))
            if client:
                r.send("exception", exc_type=exc[0], message=exc[1], traceback=trace,
                       causes=[list(c) for c in causes], pid=r.pid)  # fmt: skip
        if stuck:
            await r.hang()
        return 1

    return script


class Said(logging.Handler):
    """The daemon's log lines (what its console shows), as text."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields: dict[str, Any] | None = getattr(record, "fields", None)
        self.lines.append(record.getMessage() + (" " + format_fields(fields) if fields else ""))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@contextlib.contextmanager
def console() -> Iterator[Said]:
    said = Said()
    logger = logging.getLogger(LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)  # what the console shows at the daemon's default level
    logger.addHandler(said)
    try:
        yield said
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)


def reason_of(rundir: Path) -> dict[str, Any]:
    reason: dict[str, Any] = json.loads((rundir / "reason.json").read_text())
    return reason
