"""The kernel's log, read live from /dev/kmsg while the ranks run, so that an Xid,
an ECC error or the OOM killer joins a failure's evidence in the run, not only in
a post-mortem (``ft-supervisor classify --dmesg``).

Read from the run's start (the records before it are skipped), without blocking
the loop (non-blocking reads when the descriptor is readable, a bounded number per
turn), into a bounded buffer. Unreadable (no /dev/kmsg, no permission: it is the
`syslog` capability's, or root's where dmesg_restrict is set) is said once, and
supervision goes on without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections import deque

from supervisor.core.catalogue.health import KernelLogUnavailable
from supervisor.core.kmsg import KernelLine, parse_record
from supervisor.core.types import EventSink

KMSG = "/dev/kmsg"
# where to read instead: a container given its host's kernel log under another path,
# or a test's FIFO (one record per write, as /dev/kmsg hands them out)
KMSG_ENV = "FT_SUPERVISOR_KMSG"
KEEP = 2000  # kernel lines buffered: the newest
PER_TURN = 256  # records read per loop turn at most: a flood cannot stall the loop
GIVEN = 200  # kernel lines given to one failure's evidence at most
RECORD = 8192  # a /dev/kmsg read must offer room for the whole record


class KernelLog:
    def __init__(self, events: EventSink, path: str | None = None) -> None:
        self._events, self._path = events, path or os.environ.get(KMSG_ENV) or KMSG
        self._fd: int | None = None
        self._lines: deque[KernelLine] = deque(maxlen=KEEP)
        self.lost = 0  # records the kernel overwrote before we read them

    def start(self) -> bool:
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            self._events.emit(KernelLogUnavailable(path=self._path, error=exc.strerror or str(exc)))
            return False
        with contextlib.suppress(OSError):  # a FIFO has no end to seek to
            os.lseek(fd, 0, os.SEEK_END)  # from the run's start
        try:
            asyncio.get_running_loop().add_reader(fd, self._drain)
        except (OSError, NotImplementedError, RuntimeError) as exc:
            os.close(fd)
            self._events.emit(KernelLogUnavailable(path=self._path, error=str(exc)))
            return False
        self._fd = fd
        return True

    def _drain(self) -> None:
        fd = self._fd
        if fd is None:
            return
        for _ in range(PER_TURN):
            try:
                raw = os.read(fd, RECORD)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten before we read it: the next one follows
                    self.lost += 1
                    continue
                self._stop(str(exc))
                return
            if not raw:  # end of file: not /dev/kmsg, nothing more will come
                self.close()
                return
            line = parse_record(raw)
            if line is not None:
                self._lines.append(line)

    def _stop(self, why: str) -> None:
        self.close()
        self._events.emit(KernelLogUnavailable(path=self._path, error=why), logging.WARNING)

    def since(self, at: float) -> tuple[str, ...]:
        """The kernel's lines from ``at`` (CLOCK_MONOTONIC seconds) on, the newest GIVEN."""
        self._drain()
        return tuple(line.text for line in self._lines if line.at >= at)[-GIVEN:]

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)
