"""Follow rank log files onto the console with a ``[rank N]`` prefix, and notice
the lines that look like trouble while the ranks run.

Ranks write their log files themselves; the console is a copy. Reading a local
file that has nothing new costs one read(2) returning 0 bytes, so a short poll
is cheaper and simpler than inotify, and it works on network filesystems.

Every rank's files are read, shown on the console or not, so that an NCCL
watchdog line or the first traceback is kept as evidence even when a flood of
output (a stack dump, a thousand ranks' warnings) pushes it out of the log's
tail before the rank exits. A keyword search over each chunk finds them
(``supervisor.core.notable``); the classifier's rules look at them later.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.core.notable import notable_lines, says_going_down, says_peer_broke, says_timed_out_waiting
from supervisor.log import Console

MAX_LINE = 64 * 1024  # a line longer than this is printed in pieces
READ_SIZE = 256 * 1024
NOTABLE_LINES = 256  # kept per rank and generation: the first quarter, then the latest
NOTABLE_LINE_MAX = 2048


@dataclass
class Notable:
    """Trouble-looking lines of one rank: the first ones (the cause is often early)
    and the latest ones, bounded. Lines that reach its log after the rank exited were
    written by processes it left behind (forked data-loader workers...), not by it:
    they are kept apart."""

    first: list[str] = field(default_factory=list)
    latest: deque[str] = field(default_factory=lambda: deque(maxlen=NOTABLE_LINES * 3 // 4))
    after_exit: deque[str] = field(default_factory=lambda: deque(maxlen=NOTABLE_LINES // 4))
    exited: bool = False
    going_down: str | None = None  # the first line in which torch said it takes the rank down
    tears_down: bool = True  # whether an NCCL watchdog failure takes the process down
    waited: str | None = None  # the first line saying it waited in a collective past its timeout
    witnessed: str | None = None  # the first line blaming a peer for its collective (a witness)

    def add(self, line: str) -> None:
        if self.exited:
            self.after_exit.append(line)
            return
        if self.going_down is None and says_going_down(line, self.tears_down):
            self.going_down = line
        if self.waited is None and says_timed_out_waiting(line):
            self.waited = line
        if self.witnessed is None and says_peer_broke(line):
            self.witnessed = line
        if len(self.first) < NOTABLE_LINES // 4:
            self.first.append(line)
        else:
            self.latest.append(line)

    def lines(self) -> tuple[str, ...]:
        return (*self.first, *self.latest)


@dataclass
class _Followed:
    rank: int
    prefix: bytes
    path: Path
    stream: int
    show: bool
    fd: int = -1
    partial: bytes = field(default=b"")
    consumed: int = 0  # bytes read so far
    duplicate: tuple[bytes, ...] = ()  # torchrun's --duplicate-std*-filters: lines containing one
    into: Path | None = None  # where those lines are copied


class LogFollower:
    def __init__(self, console: Console, *, tears_down: bool = True) -> None:
        """``tears_down``: whether an NCCL watchdog failure takes a rank's process down
        (``core.notable.nccl_tears_down`` of the ranks' environment)."""
        self._console = console
        self._tears_down = tears_down
        self._files: list[_Followed] = []
        self._copies: dict[Path, int] = {}  # the open --duplicate-std*-filters files
        self.notable: dict[int, Notable] = {}
        self.after_exit: dict[int, tuple[str, ...]] = {}  # of the last finished generation

    def follow(
        self,
        rank: int,
        path: Path,
        stream: int,
        *,
        show: bool = True,
        duplicate: tuple[str, ...] = (),
        into: Path | None = None,
    ) -> None:
        """Read ``path`` as it grows; copy it to the console when ``show``, and the
        lines shown that contain one of ``duplicate`` to ``into`` as well."""
        needles = tuple(n.encode() for n in duplicate) if show and into is not None else ()
        prefix = f"[rank {rank}] ".encode()
        self._files.append(_Followed(rank, prefix, path, stream, show, duplicate=needles, into=into))
        self.notable.setdefault(rank, Notable(tears_down=self._tears_down))

    def poll(self) -> None:
        for f in self._files:
            self._read(f)

    def _read(self, f: _Followed) -> None:
        if f.fd < 0:
            try:
                f.fd = os.open(f.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:  # not there yet, or no descriptor left this instant: next poll
                return
        while chunk := os.read(f.fd, READ_SIZE):
            f.consumed += len(chunk)
            *lines, f.partial = (f.partial + chunk).split(b"\n")
            if len(f.partial) > MAX_LINE:
                lines.append(f.partial)
                f.partial = b""
            if not lines:
                continue
            if f.show:
                self._console.rank_lines(f.stream, f.rank, lines)
            if f.duplicate:
                self._duplicate(f, lines)
            self._notice(f.rank, lines)

    def _duplicate(self, f: _Followed, lines: list[bytes]) -> None:
        """torchrun's filtered_stdout.log / filtered_stderr.log: the lines with a needle."""
        kept = b"".join(f.prefix + ln + b"\n" for ln in lines if any(n in ln for n in f.duplicate))
        if not kept or f.into is None:
            return
        fd = self._copies.get(f.into)
        try:
            if fd is None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
                fd = self._copies[f.into] = os.open(f.into, flags, 0o644)
            os.write(fd, kept)
        except OSError:
            f.duplicate = ()  # a full disk: the copy stops, supervision does not

    def exited(self, rank: int) -> dict[Path, int]:
        """The rank's process is gone: read what it wrote, and say how far its files
        went then (by path). What comes later is from processes it left behind."""
        offsets = {}
        for f in self._files:
            if f.rank == rank:
                self._read(f)
                offsets[f.path] = f.consumed
        if rank in self.notable:
            self.notable[rank].exited = True
        return offsets

    def _notice(self, rank: int, lines: list[bytes]) -> None:
        notable = self.notable[rank]
        for line in notable_lines(b"\n".join(lines).decode(errors="replace")):
            notable.add(line[:NOTABLE_LINE_MAX])

    def going_down(self, rank: int) -> str | None:
        """The line in which torch said it takes ``rank`` down, if it said so this generation."""
        notable = self.notable.get(rank)
        return None if notable is None else notable.going_down

    def waited(self, rank: int) -> str | None:
        """The line in which ``rank`` said it waited in a collective past its timeout, if it did."""
        notable = self.notable.get(rank)
        return None if notable is None else notable.waited

    def witnessed(self, rank: int) -> str | None:
        """The line in which ``rank`` blamed a peer for its collective (a mismatch, a reset), if it did."""
        notable = self.notable.get(rank)
        return None if notable is None else notable.witnessed

    def finish(self) -> dict[int, tuple[str, ...]]:
        """Copy what is left, including an unterminated last line, and stop.
        Returns the notable lines of each rank followed."""
        self.poll()
        for f in self._files:
            if f.partial:
                if f.show:
                    self._console.rank_lines(f.stream, f.rank, [f.partial])
                if f.duplicate:
                    self._duplicate(f, [f.partial])
                self._notice(f.rank, [f.partial])
            if f.fd >= 0:
                os.close(f.fd)
        self._files.clear()
        for fd in self._copies.values():
            os.close(fd)
        self._copies.clear()
        found = {rank: n.lines() for rank, n in self.notable.items()}
        self.after_exit = {rank: tuple(n.after_exit) for rank, n in self.notable.items() if n.after_exit}
        self.notable = {}
        return found
