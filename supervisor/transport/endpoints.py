"""Where the daemon listens: ipc:// sockets in a private directory.

    <base>/<daemon pid>/          mode 0700: only this user can connect
        ranks.sock                ROUTER: messages from the ranks' clients
        control.sock              ROUTER: requests from ``ft-supervisor status|stop|restart``
        events.sock               PUB: every event, topic = event name
        daemon.json               who listens here (pid, run id, run dir, and where it runs:
                                  pid namespace, working directory, log dir), for discovery

<base> is $XDG_RUNTIME_DIR/ft-supervisor, else $TMPDIR/ft-supervisor-<uid>, else
/tmp/ft-supervisor-<uid>: the first whose socket paths fit in a unix socket
address (107 bytes). The directory mode is the access control: ipc sockets are
files, and nobody else can reach into a 0700 directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import zmq
import zmq.asyncio

from supervisor.transport.schema import MAX_MESSAGE

# zmq refuses (and disconnects) a peer that sends more than this: a hard cap on
# what one message can make the daemon allocate. Between MAX_MESSAGE and this,
# messages are received, counted as oversized and dropped.
HARD_CAP = 4 * MAX_MESSAGE
RCV_HWM = 10_000  # queued messages per peer: bounds the daemon's memory under bursts
HANDSHAKE_MS = 2000


class EndpointError(RuntimeError):
    pass


# sockaddr_un.sun_path less its NUL; a longer ipc:// path cannot be bound at all
IPC_PATH_MAX = 107
# the longest path under a base: "/<pid>/control.sock", a pid of up to 7 digits
_LONGEST_TAIL = len("/4194304/control.sock")


def base_dir(environ: dict[str, str] | None = None) -> Path:
    """Where daemons listen. Daemons and the commands that look for them pick the
    same one from the same environment, whatever the pid."""
    env = environ if environ is not None else dict(os.environ)
    candidates = []
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg and os.access(xdg, os.W_OK | os.X_OK):
        candidates.append(Path(xdg) / "ft-supervisor")
    candidates.append(Path(tempfile.gettempdir()) / f"ft-supervisor-{os.getuid()}")
    for base in candidates:
        if len(os.fsencode(base)) + _LONGEST_TAIL <= IPC_PATH_MAX:
            return base
    return Path("/tmp") / f"ft-supervisor-{os.getuid()}"  # noqa: S108 - short on purpose; the mode guards it


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise EndpointError(f"{path} is not a directory owned by this user")
    if info.st_mode & 0o077:
        path.chmod(0o700)


@dataclass(frozen=True, slots=True)
class Endpoints:
    dir: Path

    @classmethod
    def create(cls, pid: int, environ: dict[str, str] | None = None) -> Endpoints:
        base = base_dir(environ)
        _private_dir(base)
        here = base / str(pid)
        if here.exists():  # a dead daemon's leftovers under a recycled pid
            shutil.rmtree(here)
        _private_dir(here)
        running_daemons(environ)  # and other dead daemons' (SIGKILLed ones leave theirs)
        return cls(here)

    @property
    def ranks(self) -> str:
        return f"ipc://{self.dir / 'ranks.sock'}"

    @property
    def control(self) -> str:
        return f"ipc://{self.dir / 'control.sock'}"

    @property
    def events(self) -> str:
        return f"ipc://{self.dir / 'events.sock'}"

    @property
    def info(self) -> Path:
        return self.dir / "daemon.json"

    def publish_info(self, **info: Any) -> None:
        # its start time tells this daemon from a process that later gets the same pid
        info.setdefault("starttime", process_start(os.getpid()))
        # where it runs: the control commands act unasked only on a daemon of their own
        # environment (supervisor.cli.control), and a pid means something only in its namespace
        info.setdefault("pidns", pid_namespace())
        info.setdefault("cwd", str(Path.cwd()))
        tmp = self.info.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(info))
        tmp.replace(self.info)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Sockets:
    ranks: zmq.asyncio.Socket
    control: zmq.asyncio.Socket
    events: zmq.asyncio.Socket

    def close(self) -> None:
        for s in (self.ranks, self.control, self.events):
            s.close(linger=0)


def bind(ctx: zmq.asyncio.Context, endpoints: Endpoints) -> Sockets:
    def socket(kind: int, address: str) -> zmq.asyncio.Socket:
        s = ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        # a connection that never completes ZeroMQ's handshake (raw bytes, or nothing)
        # gives its descriptor back after this long
        s.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        if kind == zmq.ROUTER:
            s.setsockopt(zmq.MAXMSGSIZE, HARD_CAP)
            s.setsockopt(zmq.RCVHWM, RCV_HWM)
        s.bind(address)
        return s

    return Sockets(
        ranks=socket(zmq.ROUTER, endpoints.ranks),
        control=socket(zmq.ROUTER, endpoints.control),
        events=socket(zmq.XPUB, endpoints.events),
    )


def process_start(pid: int) -> int | None:
    """When the process started (clock ticks since boot, /proc/<pid>/stat field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_namespace(pid: int | str = "self") -> str | None:
    """The pid namespace a process runs in (``pid:[4026531836]``), None where unreadable."""
    try:
        return str(Path(f"/proc/{pid}/ns/pid").readlink())
    except OSError:
        return None


def _listening(path: Path) -> bool:
    """Someone accepts connections on this unix socket: a daemon alive, whatever its pid
    namespace (where its pid means nothing here)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def running_daemons(environ: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Daemons of this user that are alive, from their daemon.json files. The directory of
    one that is gone (a SIGKILLed daemon leaves it) is removed; one whose pid now names
    another process is skipped. One of another pid namespace (a container sharing this
    directory) is listed while its control socket answers."""
    found = []
    base = base_dir(environ)
    own_ns = pid_namespace()
    for info in sorted(base.glob("*/daemon.json")):
        try:
            data = orjson.loads(info.read_bytes())
            pid = int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
            continue
        if data.get("pidns") not in (None, own_ns):
            if _listening(info.parent / "control.sock"):
                data["dir"] = str(info.parent)
                found.append(data)
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(info.parent, ignore_errors=True)
            continue
        except OSError:
            continue
        started = data.get("starttime")
        if isinstance(started, int) and started != process_start(pid):
            continue  # the pid was recycled: not our daemon (it may be another namespace's)
        data["dir"] = str(info.parent)
        found.append(data)
    return found
