"""Console output and the daemon's log format.

Everything the daemon prints (its own events and the ranks' lines) goes through
one writer thread with a bounded queue: a terminal or pipe that stops reading
must never block the event loop, which has crashes and hangs to notice. Lines
that do not fit are dropped and counted, never waited for.

Log records are events with fields, the same names as in the event log::

    [ft-supervisor] 13:34:24.117 rank_exited generation=0 rank=1 exit_code=1
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
import time
from typing import IO, Any

import orjson

STDOUT = 1
STDERR = 2

_STOP = object()


class Console:
    def __init__(self, maxsize: int = 10000) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize)
        self._thread = threading.Thread(target=self._drain, name="console", daemon=True)
        self.dropped = 0

    def start(self) -> None:
        self._thread.start()

    def write(self, stream: int, data: bytes) -> None:
        try:
            self._queue.put_nowait((stream, data))
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 2.0) -> None:
        """Flush what is queued (bounded by ``timeout``) and stop the thread."""
        if not self._thread.is_alive():
            return
        # never block here either: a full queue means a stuck console
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout)
        self._thread.join(timeout)

    def _drain(self) -> None:
        streams: dict[int, IO[bytes]] = {STDOUT: sys.stdout.buffer, STDERR: sys.stderr.buffer}
        # flush every stream written since the queue last ran dry, not only the
        # last one: a rank's final stdout line followed by the daemon's stderr
        # event about its exit must not wait in stdout's buffer for more output
        dirty: set[int] = set()
        while (item := self._queue.get()) is not _STOP:
            stream, data = item
            try:
                streams[stream].write(data)
            except (OSError, ValueError):
                self.dropped += 1
                continue
            dirty.add(stream)
            if self._queue.empty():
                for written in dirty:
                    with contextlib.suppress(OSError, ValueError):
                        streams[written].flush()
                dirty.clear()


def _format_value(value: object) -> str:
    if isinstance(value, dict | list | tuple):
        return orjson.dumps(value).decode()  # compact JSON has no spaces to quote
    text = str(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def format_fields(fields: dict[str, Any]) -> str:
    return " ".join(f"{k}={_format_value(v)}" for k, v in fields.items() if v is not None)


class EventFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        millis = int(record.msecs)
        level = "" if record.levelno == logging.INFO else f"{record.levelname} "
        fields = getattr(record, "fields", None)
        line = f"[ft-supervisor] {stamp}.{millis:03d} {level}{record.getMessage()}"
        if fields:
            line += " " + format_fields(fields)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class ConsoleHandler(logging.Handler):
    def __init__(self, console: Console) -> None:
        super().__init__()
        self._console = console
        self.setFormatter(EventFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        self._console.write(STDERR, line.encode(errors="replace"))


def setup(console: Console, level: str) -> logging.Logger:
    logger = logging.getLogger("supervisor")
    logger.handlers[:] = [ConsoleHandler(console)]
    logger.setLevel(level.upper())
    logger.propagate = False
    return logger
