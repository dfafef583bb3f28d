"""A kernel log for the fast tier: the daemon's real ``KernelLog`` (its buffer, its
``since``, the /dev/kmsg record parser), fed records a test writes instead of
/dev/kmsg. A test installs it with ``kmsg(monkeypatch)`` before ``supervise``; a
script writes a line at the daemon's clock (the fast tier's monotonic time is the
kernel's timestamp here: beyond any real one, so nothing of the real log could count)."""

from __future__ import annotations

import itertools
from collections import deque

import pytest

from supervisor.core.kmsg import parse_record
from supervisor.core.types import EventSink
from supervisor.runtime.lifecycle import daemon
from supervisor.runtime.services.kernellog import KernelLog


class FakeKernelLog(KernelLog):
    def __init__(self, events: EventSink, records: deque[bytes]) -> None:
        super().__init__(events, path="fake-kmsg")
        self._records = records
        self.started = False

    def start(self) -> bool:
        self.started = True
        return True

    def _drain(self) -> None:
        while self._records:
            line = parse_record(self._records.popleft())
            if line is not None:
                self._lines.append(line)

    def close(self) -> None:
        self.started = False


class Kmsg:
    """What the kernel writes: one record per line, as /dev/kmsg hands them out."""

    def __init__(self) -> None:
        self.records: deque[bytes] = deque()
        self._seq = itertools.count(9001)
        self.logs: list[FakeKernelLog] = []

    def write(self, line: str, at: float, priority: int = 3) -> None:
        self.records.append(f"{priority},{next(self._seq)},{int(at * 1e6)},-;{line}\n".encode())

    def log(self, events: EventSink) -> FakeKernelLog:
        made = FakeKernelLog(events, self.records)
        self.logs.append(made)
        return made


def kmsg(monkeypatch: pytest.MonkeyPatch) -> Kmsg:
    """Every daemon built from now on in this test reads its kernel lines from the result."""
    fake = Kmsg()
    monkeypatch.setattr(daemon, "KernelLog", fake.log)
    return fake
