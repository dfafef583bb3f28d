"""Follow rank log files onto the console with a ``[rank N]`` prefix.

Ranks write their log files themselves; the console is a copy. Reading a local
file that has nothing new costs one read(2) returning 0 bytes, so a short poll
is cheaper and simpler than inotify, and it works on network filesystems.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.log import Console

MAX_LINE = 64 * 1024  # a line longer than this is printed in pieces
READ_SIZE = 256 * 1024


@dataclass
class _Followed:
    prefix: bytes
    path: Path
    stream: int
    fd: int = -1
    partial: bytes = field(default=b"")


class LogFollower:
    def __init__(self, console: Console) -> None:
        self._console = console
        self._files: list[_Followed] = []

    def follow(self, rank: int, path: Path, stream: int) -> None:
        self._files.append(_Followed(f"[rank {rank}] ".encode(), path, stream))

    def poll(self) -> None:
        for f in self._files:
            self._read(f)

    def _read(self, f: _Followed) -> None:
        if f.fd < 0:
            try:
                f.fd = os.open(f.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return
        while chunk := os.read(f.fd, READ_SIZE):
            *lines, f.partial = (f.partial + chunk).split(b"\n")
            if len(f.partial) > MAX_LINE:
                lines.append(f.partial)
                f.partial = b""
            if lines:
                self._console.write(f.stream, b"".join(f.prefix + ln + b"\n" for ln in lines))

    def finish(self) -> None:
        """Copy what is left, including an unterminated last line, and stop."""
        self.poll()
        for f in self._files:
            if f.partial:
                self._console.write(f.stream, f.prefix + f.partial + b"\n")
            if f.fd >= 0:
                os.close(f.fd)
        self._files.clear()
