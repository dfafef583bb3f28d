"""Orphans come back to the daemon, and the daemon buries them.

A rank's descendants that lose their parent (a double fork, a dataloader worker
whose rank died) are reparented to the nearest *child subreaper* above them, or
to PID 1. The daemon makes itself that subreaper (``PR_SET_CHILD_SUBREAPER``),
so they stay inside the run instead of leaking to init; as a container's PID 1
it gets every orphan of the container by nature. Either way, their exits are
ours to collect, or they stay zombies for the rest of the run.

The ranks themselves are asyncio subprocesses: the event loop's child watcher
collects their exit statuses with ``waitpid(pid)``, so this module never calls
``waitpid(-1)``, which could take a rank's status from under the loop (libuv
then never reports that rank's exit). It lists our zombie children and waits
for each one that is not a process the daemon started, and only once it has
been a zombie for a whole pass: the loop reaps its own children as soon as it
runs, so a child that stays a zombie across two passes was nobody's business
but ours (that also covers a rank that died while its spawn was being awaited,
before anyone could know its pid). No SIGCHLD handler: the loop owns SIGCHLD.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def become_subreaper() -> bool:
    """Orphaned descendants come to us instead of init; False where the system says no."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of ``pid``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def children() -> list[int]:
    """Our child processes, from /proc/self/task/*/children (any thread may be the parent),
    or, on a kernel without CONFIG_PROC_CHILDREN, from a scan of /proc."""
    own = os.getpid()
    try:
        files = list(Path(f"/proc/{own}/task").glob("*/children"))
    except OSError:
        files = []
    if files:
        found: set[int] = set()
        for file in files:
            try:
                found.update(int(p) for p in file.read_text().split())
            except OSError:
                continue  # that thread just ended
        return sorted(found)
    scanned = []
    with os.scandir("/proc") as entries:
        for e in entries:
            if e.name.isdigit() and (state := _state(int(e.name))) is not None and state[1] == own:
                scanned.append(int(e.name))
    return scanned


def zombie_children() -> list[int]:
    return [pid for pid in children() if (state := _state(pid)) is not None and state[0] == "Z"]


class Reaper:
    """Waits for zombie children that are not ``ours``; call ``reap`` about once a second."""

    def __init__(self, ours: Callable[[int], bool]) -> None:
        self._ours = ours
        self._pending: set[int] = set()  # zombies seen at the last pass, not yet ripe

    def reap(self) -> list[tuple[int, int]]:
        """One pass: (pid, status) of each orphan reaped, status as Popen's returncode
        (the exit code, or minus the signal that killed it)."""
        zombies = {pid for pid in zombie_children() if not self._ours(pid)}
        ripe, self._pending = zombies & self._pending, zombies - self._pending
        reaped = []
        for pid in sorted(ripe):
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue  # someone else waited for it after all
            if got == pid:
                reaped.append((pid, os.waitstatus_to_exitcode(status)))
        return reaped
