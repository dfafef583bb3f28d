"""Process containment: one cgroup v2 per generation, ended with ``cgroup.kill``.

A rank's descendant can leave everything else the daemon holds it by: its process
group and session (``setsid``), its parent (a double fork), PR_SET_PDEATHSIG (armed
in the rank only, and cleared by fork) and the token in its environment (``execve``
with an empty one). It cannot leave its cgroup: every process starts in its
parent's, and only a write to a ``cgroup.procs`` file, which needs write access to
the cgroup tree, moves it. So where the kernel lets the daemon create cgroups, each
generation gets one, and ending a generation kills its cgroup.

Where: a child of the daemon's own cgroup (the ``0::`` line of /proc/self/cgroup,
under the cgroup2 mount in /proc/self/mountinfo). That is the part of the tree
that is the daemon's to divide: the unit's cgroup under systemd with
``Delegate=yes``, the container's own with a writable cgroup namespace, the root
of the unified hierarchy when run as root on a host::

    <the daemon's cgroup>/ft-supervisor-<pid>-<hash of the run token>-<pid namespace>/
                          the run's: no process of its own
        gen-<g>/          the ranks of generation g, standbys included, and all their descendants

cgroup v2's "no internal processes" rule forbids a cgroup to hold processes while
it passes controllers down (``cgroup.subtree_control``). The daemon enables no
controller anywhere, so it may stay where it is, beside the run's cgroup; and a
cgroup that already passes controllers down holds no process of its own unless it
is the root, which the rule exempts. Either way nothing has to move but the ranks.

A rank joins its generation's cgroup itself, as the first thing its bootstrap
does (``supervisor/process/bootstrap.py``): before it preloads, forks or runs a
line of the user's program, so everything it ever starts is born inside. A
standby is in its generation's cgroup while the previous generation still runs.

Whether all this works here is found out once, at the start, by doing it: a child
of the daemon moves itself into a cgroup under the run's and is killed with it.
Where that fails (cgroup v1 only, a read-only cgroup mount as in most
containers, a tree not delegated to this user), the daemon falls back to process
groups, PR_SET_PDEATHSIG and the token sweep, and says so (``containment`` event,
``status``).

Everything here blocks, briefly: cgroupfs is in memory. The probe and the waits
for a cgroup to empty run off the event loop.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.process.sentinel import kill_cgroup, populated, remove_cgroup

PROC_CGROUP = "/proc/self/cgroup"
MOUNTINFO = "/proc/self/mountinfo"
PROBE_TIMEOUT = 5.0
# then the daemon's pid, the hash of its run's token and its pid namespace, dash-separated
PREFIX = "ft-supervisor-"
# What a rank's bootstrap does first, done by a throwaway process: move itself
# into the cgroup, say so, then wait to be killed with it.
_PROBE = (
    "import os, sys\n"
    "fd = os.open(sys.argv[1], os.O_WRONLY)\n"
    "os.write(fd, b'0')\n"
    "print('in', flush=True)\n"
    "sys.stdin.read()\n"
)


@dataclass(frozen=True, slots=True)
class Containment:
    """What holds a generation's processes together.

    ``cgroup`` set: that cgroup, killed as a whole (``kill``: ``cgroup.kill``, or
    ``signals`` on a kernel without it). None: the fallback, process groups,
    PR_SET_PDEATHSIG and the token sweep, and ``why`` there is no cgroup.
    """

    cgroup: Path | None = None
    kill: str | None = None
    why: str | None = None

    def describe(self) -> dict[str, Any]:
        if self.cgroup is None:
            return {"mode": "fallback", "why": self.why}
        return {"mode": "cgroup", "cgroup": str(self.cgroup), "kill": self.kill}

    def generation(self, number: int) -> Containment:
        """The cgroup of generation ``number`` under this, the run's; created if need be.
        Raises OSError when it cannot be created."""
        if self.cgroup is None:
            return self
        path = self.cgroup / f"gen-{number}"
        path.mkdir(exist_ok=True)
        return Containment(path, self.kill)


UNCONTAINED = Containment(why="not placed in a cgroup")


def own_cgroup(proc_cgroup: str) -> str | None:
    """The daemon's cgroup v2 path, from the text of /proc/self/cgroup."""
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            return path
    return None


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def cgroup2_mounts(mountinfo: str) -> list[tuple[str, str, bool]]:
    """(root within the hierarchy, mount point, writable) of every cgroup2 mount."""
    found = []
    for line in mountinfo.splitlines():
        ours, sep, theirs = line.partition(" - ")
        fields, tail = ours.split(), theirs.split()
        if not sep or len(fields) < 6 or not tail or tail[0] != "cgroup2":
            continue
        # read-only either for this mount or for the whole superblock
        writable = "ro" not in fields[5].split(",") and "ro" not in tail[-1].split(",")
        found.append((_unescape(fields[3]), _unescape(fields[4]), writable))
    return found


def resolve(path: str, mounts: list[tuple[str, str, bool]]) -> Path | str:
    """Where cgroup ``path`` is on disk: the directory, or why it is nowhere usable."""
    if path.startswith("/.."):
        return "the daemon's cgroup lies outside its cgroup namespace"
    if not mounts:
        return "no cgroup2 hierarchy is mounted (cgroup v1 only)"
    read_only = None
    for root, point, writable in mounts:
        inside = os.path.relpath(path, root)
        if inside == ".." or inside.startswith("../"):
            continue  # this mount shows another part of the tree
        where = Path(point) if inside == "." else Path(point) / inside
        if writable:
            return where
        read_only = read_only or where
    if read_only is not None:
        return f"the cgroup2 hierarchy at {read_only} is mounted read-only"
    return f"no cgroup2 mount shows the daemon's cgroup {path}"


def locate() -> Path | str:
    """The daemon's own cgroup directory, or why there is none to use."""
    try:
        with open(PROC_CGROUP) as f:
            path = own_cgroup(f.read())
        with open(MOUNTINFO) as f:
            mounts = cgroup2_mounts(f.read())
    except OSError as exc:
        return f"cannot read /proc: {exc.strerror}"
    if path is None:
        return "the daemon is in no cgroup v2 (cgroup v1 only)"
    return resolve(path, mounts)


def run_cgroup(run_entry: bytes) -> Path | str:
    """Where the run's cgroup goes (the daemon and its sentinel agree on it this way),
    or why it has none. The run's token is hashed: cgroup names are public."""
    parent = locate()
    if isinstance(parent, str):
        return parent
    digest = hashlib.sha256(run_entry).hexdigest()[:12]
    return parent / f"{PREFIX}{os.getpid()}-{digest}-{pid_namespace()}"


def pid_namespace() -> str:
    """This process's pid namespace (the inode of its nsfs entry): whose pids a run
    cgroup's name holds. "0" where it cannot be read."""
    try:
        return str(Path("/proc/self/ns/pid").stat().st_ino)
    except OSError:
        return "0"


def _probe(run: Path) -> str | None:
    """Do once what every generation will: a child of the daemon moves itself into
    a cgroup under the run's and dies with it. None when it worked, else why not."""
    cgroup = run / "probe"
    cgroup.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-S", "-c", _PROBE, str(cgroup / "cgroup.procs")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    try:
        if child.stdout.readline() != b"in\n":  # it failed (a traceback) and exited
            error = child.stderr.read().decode(errors="replace").strip().splitlines()
            return f"a process cannot move itself into {cgroup}: {error[-1] if error else '?'}"
        kill_cgroup(str(cgroup))
        if child.wait(PROBE_TIMEOUT) != -signal.SIGKILL:
            return f"killing {cgroup} did not kill the process inside it"
        return None
    except subprocess.TimeoutExpired:
        return f"killing {cgroup} did not kill the process inside it"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for stream in (child.stdin, child.stdout, child.stderr):
            if stream is not None:
                stream.close()
        remove_cgroup(str(cgroup))


def _remove_stale(parent: Path) -> None:
    """Remove the empty run cgroups of daemons that are gone. A cgroup cannot be
    removed while it holds a process: a rank stuck in the kernel keeps its cgroup
    until long after its daemon and sentinel gave up on it; this is the next
    daemon tidying up. One whose daemon's pid is alive (or reused) is left alone,
    and so is one whose daemon ran in another pid namespace (another container on
    the same cgroup tree: its pids mean nothing here, and its fresh, still empty
    generation cgroup is not ours to remove), and any tree that still holds a process."""
    try:
        found = list(parent.glob(f"{PREFIX}*"))
    except OSError:
        return  # not ours to list: nothing of ours to tidy either
    ours = pid_namespace()
    for path in found:
        pid, _, namespace = _parts(path.name)
        if namespace != ours or not pid.isdigit() or Path(f"/proc/{pid}").exists() or populated(str(path)):
            continue
        remove_cgroup(str(path), timeout=0.0)


def _parts(name: str) -> tuple[str, str, str]:
    """A run cgroup's name: (pid, token hash, pid namespace); empty parts where absent."""
    parts = name.removeprefix(PREFIX).split("-")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else ("", "", "")


def open_run(where: Path | str) -> Containment:
    """Create the run's cgroup at ``where`` and check that it holds and kills its
    processes; the fallback (and why) where it cannot. Blocks: run it off the loop."""
    if isinstance(where, str):
        return Containment(why=where)
    _remove_stale(where.parent)
    try:
        where.mkdir()
    except OSError as exc:
        return Containment(why=f"cannot create a cgroup in {where.parent}: {exc.strerror}")
    try:
        why = _probe(where)
    except OSError as exc:
        why = f"cannot use a cgroup in {where}: {exc.strerror}"
    if why is not None:
        remove_cgroup(str(where))
        return Containment(why=why)
    kill = "cgroup.kill" if (where / "cgroup.kill").exists() else "signals"
    return Containment(where, kill)
