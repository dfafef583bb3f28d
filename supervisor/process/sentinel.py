"""The orphan sentinel, and how to find a run's processes by their token.

Every process a rank starts inherits the rank's environment, including our
token, even after it leaves the rank's process group (setsid, double fork).
So the token finds a run's (or a generation's) processes, and only them: it is
random, never a pid the kernel may have handed to a stranger by now.

The sentinel is a small process the daemon starts first: it holds the read end
of a pipe whose write end only the daemon has. When the daemon dies, however it
dies (SIGKILL included), the kernel closes the pipe, the sentinel reads EOF and
kills every process of the run. Ranks die of PR_SET_PDEATHSIG on their own; the
sentinel is for their descendants, which pdeathsig does not reach.

    python -P .../supervisor/process/sentinel.py ENTRY

Standard library only, runnable by path; the daemon and the tests import it too.
"""

from __future__ import annotations

import os
import signal
import sys


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


def main(argv: list[str]) -> None:
    (entry,) = argv
    # Terminal and scheduler signals are the daemon's business: the sentinel
    # outlives them so that it can clean up after the daemon.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while sys.stdin.buffer.read(65536):
        pass
    sweep(os.fsencode(entry), prefix=True)


if __name__ == "__main__":
    main(sys.argv[1:])
