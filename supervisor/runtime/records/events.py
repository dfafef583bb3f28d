"""The event log: one JSON line per lifecycle event, one file per run.

Each event is appended with a single write(2) on an O_APPEND descriptor before
the daemon acts on it (and published on the events socket), so the file is
complete up to the instant the daemon died, even by SIGKILL. A page-cache
append costs microseconds; a thread hop would cost more and could reorder events.

Events are records of the catalogue (``supervisor.core.catalogue``): the record says
its name, fields, level and quiet fields. Only records are accepted: an event is never
emitted by a string name, so every line the daemon writes is one the catalogue declares.
"""

from __future__ import annotations

import errno
import logging
import os
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from supervisor.clock import Clock
from supervisor.core.catalogue import Event, envelope
from supervisor.core.catalogue.daemon import EventLogDegraded, EventLogRestored, ListenerFailed

PENDING_BYTES = 4 << 20  # kept in memory for the file while it cannot be written


class EventLog:
    def __init__(self, path: Path, logger: logging.Logger, clock: Clock, **common: Any) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._logger = logger
        self._clock = clock
        self._common = common
        # also sends each event to live subscribers (the events socket), topic = name
        self.publish: Callable[[bytes, bytes], None] | None = None
        # in-process readers of every event (metrics, sd_notify): called on the loop
        # with the event's name and its record; one that raises is dropped, not fatal
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []
        # lines the file could not take yet (a full disk), oldest first, bounded
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._degraded_by: str | None = None  # why the file stopped taking lines
        self.lost = 0  # lines dropped while degraded

    def emit(self, event: Event, level: int | None = None) -> None:
        """Record ``event``, a catalogue record, at its level unless ``level`` is given."""
        if not isinstance(event, Event):
            raise TypeError(f"an event is a catalogue record (supervisor.core.catalogue), not {event!r}")
        name, level = event.NAME, event.LEVEL if level is None else level
        quiet = event.QUIET
        record = envelope(event, self._clock.wall(), self._clock.monotonic(), self._common)
        fields = event.values()
        line = orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS)
        self._write(line + b"\n")
        if self.publish is not None:
            self.publish(name.encode(), line)
        for listener in list(self.listeners):
            try:
                listener(name, record)
            except Exception as exc:
                self.listeners.remove(listener)
                failed = ListenerFailed(event=name, error=repr(exc)).values()
                self._logger.warning(ListenerFailed.NAME, extra={"fields": failed})
        shown = {k: v for k, v in fields.items() if k not in quiet} if quiet else fields
        self._logger.log(level, name, extra={"fields": shown})

    def _write(self, data: bytes) -> None:
        """Append, or keep it for later: a full or failing log filesystem degrades the
        event log (said once, on the console and the events socket), never supervision."""
        if self._pending:
            self._pending_bytes += len(data)
            self._pending.append(data)
            self._flush()
            return
        try:
            written = os.write(self._fd, data)
        except OSError as exc:
            written, error = 0, exc
        else:
            if written == len(data):
                return
            error = OSError(errno.ENOSPC, "short write")
        self._pending.append(data[written:])
        self._pending_bytes += len(data) - written
        self._degraded(error)

    def _flush(self) -> None:
        while self._pending:
            head = self._pending[0]
            try:
                written = os.write(self._fd, head)
            except OSError:
                break
            self._pending_bytes -= written
            if written < len(head):
                self._pending[0] = head[written:]
                break
            self._pending.popleft()
        while self._pending_bytes > PENDING_BYTES and len(self._pending) > 1:
            # keep the oldest (it may be a line's written half) and the newest; drop between
            lost = self._pending[1]
            del self._pending[1]
            self._pending_bytes -= len(lost)
            self.lost += 1
        if not self._pending and self._degraded_by is not None:
            said = EventLogRestored(lost=self.lost, error=self._degraded_by)
            restored = {"event": said.NAME, **said.values()}
            self._degraded_by = None
            self._logger.warning(said.NAME, extra={"fields": restored})
            self.emit(EventLogRestored(lost=self.lost))

    def _degraded(self, error: OSError) -> None:
        if self._degraded_by is not None:
            return
        self._degraded_by = f"{error.strerror or error}"
        keeping = f"{PENDING_BYTES} bytes"
        said = EventLogDegraded(path=str(self.path), error=self._degraded_by, keeping=keeping)
        fields = said.values()
        # not to the file it could not write: the console and live subscribers hear it
        if self.publish is not None:
            self.publish(said.NAME.encode(), orjson.dumps({"event": said.NAME, **fields}))
        self._logger.error(said.NAME, extra={"fields": fields})

    @property
    def degraded(self) -> bool:
        return self._degraded_by is not None

    def close(self) -> None:
        self._flush()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
