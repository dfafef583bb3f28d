"""Console output and the daemon's log format.

Everything the daemon prints (its own events and the ranks' lines) goes through
one writer thread with a bounded queue: a terminal or pipe that stops reading
must never block the event loop, which has crashes and hangs to notice. Lines
that do not fit are dropped and counted, never waited for.

Log records are events with fields, the same names as in the event log. People read
the console (``human``: the event's name and a sentence, ``log.human``)::

    [ft-supervisor] 13:34:24.117 WARNING rank_exited: rank 1 (pid 4242) failed, exit code 1

log shippers read ``--log-format json``: one JSON object per line, the daemon's events
with their fields and the ranks' lines alike.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
import time
from datetime import UTC, datetime
from typing import IO, Any

import orjson

from supervisor.log.human import INDENT, WIDTH, fields_line, sentence, wrap

STDOUT = 1
STDERR = 2

_STOP = object()


FORMATS = ("human", "json")


class Console:
    def __init__(self, maxsize: int = 10000, *, json_lines: bool = False) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize)
        self.json_lines = json_lines
        self._thread = threading.Thread(target=self._drain, name="console", daemon=True)
        self.dropped = 0

    def start(self) -> None:
        self._thread.start()

    def write(self, stream: int, data: bytes) -> None:
        try:
            self._queue.put_nowait((stream, data))
        except queue.Full:
            self.dropped += 1

    def rank_lines(self, stream: int, rank: int, lines: list[bytes]) -> None:
        """A rank's complete lines, each under one ``[rank N]`` prefix: torch's own
        ``[rankN]:`` prefix of the same rank is not said twice."""
        if self.json_lines:
            now = datetime.now(UTC).isoformat(timespec="milliseconds")
            name = "stdout" if stream == STDOUT else "stderr"
            self.write(stream, b"".join(
                orjson.dumps({"time": now, "rank": rank, "stream": name,
                              "line": ln.decode(errors="replace")}) + b"\n" for ln in lines
            ))  # fmt: skip
            return
        prefix, torchs = f"[rank {rank}] ", f"[rank{rank}]:".encode()
        out = []
        for raw in lines:
            ln = raw[len(torchs):].removeprefix(b" ") if raw.startswith(torchs) else raw
            text = ln.decode(errors="replace")
            # a long line goes on under the same prefix: all of it is shown, none wider than WIDTH
            width = WIDTH - len(prefix)
            out += [prefix + text[i : i + width] + "\n" for i in range(0, max(len(text), 1), width)]
        self.write(stream, "".join(out).encode())

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


def format_fields(fields: dict[str, Any]) -> str:
    """``key=value`` pairs with plain values (lists joined, mappings as pairs, no JSON)."""
    return fields_line(fields)


class EventFormatter(logging.Formatter):
    """For people: ``[ft-supervisor] HH:MM:SS.mmm [LEVEL] event: sentence``, each line at
    most ``human.WIDTH`` characters; an event's further lines are indented under it."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        level = "" if record.levelno == logging.INFO else f"{record.levelname} "
        head = f"[ft-supervisor] {stamp}.{int(record.msecs):03d} {level}"
        fields = getattr(record, "fields", None)
        if fields is None:
            text = record.getMessage().splitlines() or [""]
            first = head + text[0]
        else:
            text = sentence(record.getMessage(), fields)
            first = f"{head}{record.getMessage()}: {text[0]}"
        lines = wrap(first) + [w for ln in text[1:] for w in wrap(INDENT + ln)]
        if record.exc_info:
            lines.append(self.formatException(record.exc_info))
        return "\n".join(lines)


class JsonFormatter(logging.Formatter):
    """For log shippers: one JSON object per line, an event's fields as they are."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        fields = getattr(record, "fields", None)
        out: dict[str, Any] = {"time": stamp, "level": record.levelname.lower()}
        if fields is None:
            out.update(event="message", message=record.getMessage())
        else:
            out.update(event=record.getMessage(), **fields)
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return orjson.dumps(out, option=orjson.OPT_NON_STR_KEYS, default=str).decode()


class ConsoleHandler(logging.Handler):
    def __init__(self, console: Console) -> None:
        super().__init__()
        self._console = console
        self.setFormatter(JsonFormatter() if console.json_lines else EventFormatter())

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
