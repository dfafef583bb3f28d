"""The orphan sentinel, and how to find and kill a run's processes.

Two ways to find them. Where the run has a cgroup (``supervisor.process.cgroups``),
every process started inside it stays inside, whatever it does (setsid, double
fork, execve with an empty environment): killing the cgroup cannot miss. Elsewhere,
the token: every process a rank starts inherits the rank's environment, including
our token, even after it leaves the rank's process group. So the token finds a
run's (or a generation's) processes, and only them: it is random, never a pid the
kernel may have handed to a stranger by now. A process that clears its environment
(``execve`` with an empty one) is lost to it.

The sentinel is a small process the daemon starts first: it holds the read end
of a pipe whose write end only the daemon has. When the daemon dies, however it
dies (SIGKILL included), the kernel closes the pipe, the sentinel reads EOF and
kills every process of the run: the run's cgroup, then anything left with the
token. Ranks die of PR_SET_PDEATHSIG on their own; the sentinel is for their
descendants, which pdeathsig does not reach.

    python -P .../supervisor/process/sentinel.py ENTRY [CGROUP]

Standard library only, runnable by path; the daemon and the tests import it too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from supervisor.clock import SYSTEM


def pids_with_env(entry: bytes, *, prefix: bool = False) -> list[int]:
    """Pids (other than ours) whose initial environment holds ``entry``.

    Reading /proc/PID/environ can block on a process wedged in the kernel with
    its memory map locked: call this off the event loop, from a thread that is
    allowed to never come back.
    """
    own = os.getpid()
    found = []
    with os.scandir("/proc") as entries:
        for e in entries:
            if not e.name.isdigit() or int(e.name) == own:
                continue
            try:
                with open(f"/proc/{e.name}/environ", "rb") as f:
                    items = f.read().split(b"\0")
            except OSError:
                continue  # gone, or not ours to read
            if any(i.startswith(entry) if prefix else i == entry for i in items):
                found.append(int(e.name))
    return found


def kill_all(pids: list[int], signum: int = signal.SIGKILL) -> list[int]:
    """Signal each pid; return those that still existed."""
    hit = []
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            continue
        hit.append(pid)
    return hit


def sweep(entry: bytes, *, prefix: bool, rounds: int = 3) -> int:
    """SIGKILL every process whose environ holds ``entry``; a few rounds,
    because a process may fork between one scan of /proc and its signal."""
    killed = 0
    for _ in range(rounds):
        hit = kill_all(pids_with_env(entry, prefix=prefix))
        if not hit:
            break
        killed += len(hit)
    return killed


def cgroup_pids(path: str) -> list[int]:
    """Every process in the cgroup at ``path`` and in the cgroups below it."""
    found: list[int] = []
    for top, _dirs, _files in os.walk(path):
        try:
            with open(os.path.join(top, "cgroup.procs")) as f:
                found.extend(int(p) for p in f.read().split())
        except OSError:
            continue  # removed while we walked
    return found


def _write(path: str, value: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value)
    finally:
        os.close(fd)


def kill_cgroup(path: str, timeout: float = 2.0) -> list[int]:
    """SIGKILL every process in the cgroup tree at ``path``; the pids found there first.

    ``cgroup.kill`` (Linux >= 5.14) does it in the kernel, in one step that no
    fork can outrun. Without it, freeze the tree where the kernel can (a frozen
    process cannot fork, and still dies of SIGKILL) and signal every pid in it
    until it is empty, for ``timeout`` at most.
    """
    if not os.path.isdir(path):
        return []
    found = cgroup_pids(path)
    try:
        _write(os.path.join(path, "cgroup.kill"), b"1")
        return found
    except OSError:
        pass  # no cgroup.kill (Linux < 5.14), or it will not take the write
    signal_cgroup(path, timeout)
    return found


def signal_cgroup(path: str, timeout: float = 2.0) -> None:
    """``cgroup.kill`` the long way, for kernels older than 5.14."""
    with contextlib.suppress(OSError):  # older still (< 5.2): the rounds must outrun any forking
        _write(os.path.join(path, "cgroup.freeze"), b"1")
    deadline = SYSTEM.monotonic() + timeout
    while (pids := cgroup_pids(path)) and SYSTEM.monotonic() < deadline:
        kill_all(pids)
        SYSTEM.pause(0.01)  # killed processes take a moment to leave cgroup.procs


def populated(path: str) -> bool:
    """Does the cgroup tree at ``path`` hold a process (its ``cgroup.events``)?"""
    try:
        with open(os.path.join(path, "cgroup.events")) as f:
            return "populated 1" in f.read()
    except OSError:
        return False  # gone


def remove_cgroup(path: str, timeout: float = 2.0) -> bool:
    """Remove the cgroup tree at ``path`` once its processes are gone (zombies do
    not count), waiting ``timeout`` at most. False when something is still inside:
    a process that outlived SIGKILL (stuck in the kernel)."""
    deadline = SYSTEM.monotonic() + timeout
    while populated(path) and SYSTEM.monotonic() < deadline:
        SYSTEM.pause(0.01)
    # the innermost first: a cgroup with children cannot be removed
    for top, _dirs, _files in os.walk(path, topdown=False):
        try:
            os.rmdir(top)
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return True


# How long the sentinel waits for the killed processes to leave the run's cgroup before it
# removes it. Nobody waits on the sentinel, and on a loaded node a killed process can take
# seconds to leave (its memory torn down first): with 2 s the cgroup was left behind in a
# suite run with four workers on two cores (the next daemon tidies it, not this one).
LEAVE_WAIT = 30.0


def main(argv: list[str]) -> None:
    entry, *cgroup = argv
    # Terminal and scheduler signals are the daemon's business: the sentinel
    # outlives them so that it can clean up after the daemon.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while sys.stdin.buffer.read(65536):
        pass
    # the cgroup first: what is in it cannot escape, whatever its environment
    for path in cgroup:
        kill_cgroup(path)
    sweep(os.fsencode(entry), prefix=True)
    for path in cgroup:
        remove_cgroup(path, LEAVE_WAIT)


if __name__ == "__main__":
    main(sys.argv[1:])
