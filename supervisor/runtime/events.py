"""The event log: one JSON line per lifecycle event, one file per run.

Each event is appended with a single write(2) on an O_APPEND descriptor before
the daemon acts on it (and published on the events socket), so the file is
complete up to the instant the daemon died, even by SIGKILL. A page-cache
append costs microseconds; a thread hop would cost more and could reorder events.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from supervisor.runtime.clock import Clock


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

    def emit(
        self, event: str, level: int = logging.INFO, *, quiet: tuple[str, ...] = (), **fields: Any
    ) -> None:
        """Record ``event``; fields named in ``quiet`` stay off the console (bulky text)."""
        record = {
            "event": event,
            "t_wall": self._clock.wall(),
            "t_mono": self._clock.monotonic(),
            **self._common,
            **fields,
        }
        line = orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS)
        os.write(self._fd, line + b"\n")
        if self.publish is not None:
            self.publish(event.encode(), line)
        for listener in list(self.listeners):
            try:
                listener(event, record)
            except Exception as exc:
                self.listeners.remove(listener)
                failed = {"event": event, "error": repr(exc)}
                self._logger.warning("listener_failed", extra={"fields": failed})
        shown = {k: v for k, v in fields.items() if k not in quiet} if quiet else fields
        self._logger.log(level, event, extra={"fields": shown})

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
