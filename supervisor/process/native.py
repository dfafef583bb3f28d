"""A rank's native stacks (C/C++ frames beside the Python ones) with py-spy, and
NCCL's Flight Recorder asked for a dump through torch's own pipe.

faulthandler shows where the Python code of a hung rank stands; a rank stuck in
a collective, a CUDA call or a lock is in native code, and only its native frames
say which. py-spy (``pip install 'ft-supervisor[diagnostics]'``) reads them from
outside, without the rank's cooperation, in about 0.1 s. Bounded in time (the
kill waits for it) and in size; a py-spy that is missing or fails is a reason in
the bundle, never an error.

The Flight Recorder is torch's ring buffer of a process group's last collectives
(``TORCH_NCCL_TRACE_BUFFER_SIZE``). ProcessGroupNCCL's watchdog reads the FIFO
``${TORCH_NCCL_DEBUG_INFO_PIPE_FILE}<rank>.pipe`` and, when anything is written
to it, dumps the buffer to ``${TORCH_NCCL_DEBUG_INFO_TEMP_FILE}<rank>``. The
daemon points both into the generation's directory unless the user set them.
gloo has no watchdog: no such pipe appears, and the rank's client answers on a FIFO
of its own instead (``supervisor.client.flight``); a rank without it, nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import os
import pickle
import shutil
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.clock import SYSTEM
from supervisor.core.flight import NO_DUMP, OWN_PIPE_SUFFIX

NATIVE_MAX = 512 * 1024  # bytes of py-spy output kept per rank
PIPE_ENV = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
DUMP_ENV = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
# torch 2.9's names for the last two. torch reads both (the new ones first) but warns in
# every rank about an old one that is set, even beside the new one: the daemon sets the
# names the ranks' torch knows, and a user's setting under either name stands
NEW_DUMP_ENV = "TORCH_FR_DUMP_TEMP_FILE"
NEW_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
RENAMED_IN = (2, 9)
# what the daemon may add to torchrun's environment
FLIGHT_RECORDER = frozenset({PIPE_ENV, DUMP_ENV, BUFFER_ENV, NEW_DUMP_ENV, NEW_BUFFER_ENV})
BUFFER_ENTRIES = "2000"  # torch's own default where it records at all
SETTLED = 0.2  # an NCCL dump is complete once its size has not changed for this long
POLL = 0.02  # seconds between looks for the dump (each a stat)
FLIGHT_MAX = 64 * 1024 * 1024  # bytes of a Flight Recorder dump read (2000 entries: about 2 MB)


@dataclass(frozen=True, slots=True)
class Native:
    text: str  # py-spy's dump; empty when there is none
    error: str | None  # why there is none


def py_spy() -> str | None:
    """py-spy beside this interpreter (the extra's install), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


async def native_stacks(pid: int, timeout: float, exe: str | None = None, *, stopped: bool = False) -> Native:
    """``py-spy dump --native`` of ``pid``, within ``timeout`` seconds. A ``stopped`` process
    gets its Python frames only, read from its memory (``--nonblocking``): the native ones
    need it paused through ptrace, and a stopped process is left exactly as it is."""
    exe = exe or py_spy()
    if exe is None:
        return Native("", "py-spy is not installed (pip install 'ft-supervisor[diagnostics]')")
    try:
        proc = await asyncio.create_subprocess_exec(
            exe, "dump", "--nonblocking" if stopped else "--native", "--pid", str(pid),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        return Native("", f"cannot run py-spy: {exc.strerror or exc}")
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(timeout):
            out = await _head(proc.stdout, NATIVE_MAX)
            if len(out) >= NATIVE_MAX:  # more than we keep: what we have is the bundle's
                return Native(out.decode(errors="replace"), None)
            err = await _head(proc.stderr, 4096)
            await proc.wait()
    except TimeoutError:
        return Native("", f"py-spy did not answer within {timeout:g} s")
    finally:
        await _end(proc)
    if proc.returncode != 0 or not out.strip():
        why = next((ln for ln in err.decode(errors="replace").splitlines() if ln.strip()), "no output")
        return Native("", f"py-spy failed: {why.strip()[:200]}")
    return Native(out.decode(errors="replace"), None)


async def _head(stream: asyncio.StreamReader, limit: int) -> bytes:
    """The first ``limit`` bytes (a rank may run thousands of threads), or all there is."""
    got = b""
    while len(got) < limit:
        chunk = await stream.read(limit - len(got))
        if not chunk:
            break
        got += chunk
    return got


async def _end(proc: asyncio.subprocess.Process) -> None:
    """py-spy gone and reaped, whatever it was doing. Its pipes are drained to their
    end: asyncio's wait() returns only once they are closed, and a pipe whose reading
    was paused (more output than we took) would never be."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(TimeoutError, OSError):
                while await asyncio.wait_for(stream.read(65536), 5.0):
                    pass
    await proc.wait()


def renamed(torch_version: str | None) -> bool:
    """Whether this torch reads the Flight Recorder's new names (``TORCH_FR_*``);
    an unknown version gets the old ones, which every torch reads."""
    if not torch_version:
        return False
    try:
        major, minor = (int(part) for part in torch_version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= RENAMED_IN


def flight_recorder_env(
    environ: Mapping[str, str], generation_dir: Path, torch_version: str | None = None
) -> dict[str, str]:
    """What a rank needs for its Flight Recorder to be dumped on our request into
    the generation's directory, under the names its torch reads without a warning;
    the user's own settings stand."""
    new = renamed(torch_version)
    wanted = {
        NEW_BUFFER_ENV if new else BUFFER_ENV: BUFFER_ENTRIES,
        PIPE_ENV: str(generation_dir / "nccl_pipe_rank_"),
        NEW_DUMP_ENV if new else DUMP_ENV: str(generation_dir / "nccl_trace_rank_"),
    }
    pairs = ((DUMP_ENV, NEW_DUMP_ENV), (BUFFER_ENV, NEW_BUFFER_ENV))
    users = {k for k in wanted if k in environ}
    users |= {name for pair in pairs if environ.keys() & set(pair) for name in pair}
    return {k: v for k, v in wanted.items() if k not in users}


def _ask_dump(pipe: Path) -> str | None:
    """Write to the watchdog's pipe; None when asked, else why not."""
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return "no Flight Recorder pipe (not an NCCL process group, or its buffer is off)"
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads: the process group is gone
            return "nobody reads the Flight Recorder pipe"
        return f"cannot open the Flight Recorder pipe: {exc.strerror}"
    try:
        os.write(fd, b"1")
    except OSError as exc:
        return f"cannot write to the Flight Recorder pipe: {exc.strerror}"
    finally:
        os.close(fd)
    return None


async def flight_recorder(
    env: Mapping[str, str], rank: int, timeout: float, alive: Callable[[], bool] = lambda: True
) -> tuple[Path | None, str | None]:
    """Ask rank ``rank``'s watchdog for its Flight Recorder dump and wait (within
    ``timeout``, and while ``alive()``: a rank that exits writes none, and waiting for it
    held a job's verdict for the whole bound) until it is written: (the dump's path, None)
    or (None, why not)."""
    pipe_stem, dump_stem = env.get(PIPE_ENV), env.get(NEW_DUMP_ENV) or env.get(DUMP_ENV)
    if not pipe_stem or not dump_stem:
        return None, "the Flight Recorder's pipe was not set"
    dump = Path(f"{dump_stem}{rank}")
    before = _mtime(dump)
    why = _ask_dump(Path(f"{pipe_stem}{rank}.pipe"))
    # no NCCL watchdog reads it (gloo): the rank's client answers on a FIFO of its own
    if why is not None and _ask_dump(Path(f"{pipe_stem}{rank}{OWN_PIPE_SUFFIX}")) is not None:
        return None, why
    # the client renames its dump into place whole: there it is complete as soon as it appears;
    # NCCL's watchdog writes in place: complete once it stopped growing
    whole = why is not None
    deadline = SYSTEM.monotonic() + timeout
    size, since = -1, SYSTEM.monotonic()
    while SYSTEM.monotonic() < deadline:
        await SYSTEM.sleep(POLL)
        if _mtime(dump) == before:
            if not alive():
                return None, "the rank exited before it wrote a Flight Recorder dump"
            continue
        now_size = _size(dump)
        if whole and now_size > 0:
            return dump, None
        if now_size != size:
            size, since = now_size, SYSTEM.monotonic()
        elif size > 0 and SYSTEM.monotonic() - since >= SETTLED:
            return dump, None
    return None, f"no Flight Recorder dump within {timeout:g} s"


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns / 1e9
    except OSError:
        return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class _DataOnly(pickle.Unpickler):
    """A pickle of plain data only: a Flight Recorder dump is dicts, lists, strings and
    numbers. Naming any class or function (how a pickle runs code) is refused, so a rank
    cannot make the daemon run anything by what it writes there."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the dump names {module}.{name}: not plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("the dump holds a persistent id: not plain data")


def read_flight_dump(path: Path, limit: int = FLIGHT_MAX) -> tuple[Any, str | None]:
    """The dump at ``path`` as plain data, or (None, why not). Blocking: off the loop."""
    try:
        with path.open("rb") as f:
            raw = f.read(limit + 1)
    except OSError as exc:
        return None, f"cannot read the Flight Recorder dump: {exc.strerror}"
    if len(raw) > limit:
        return None, f"the Flight Recorder dump is over {limit} bytes"
    try:
        data = _DataOnly(io.BytesIO(raw)).load()
    except Exception as exc:  # a torn or hostile pickle fails in many ways: each is a reason
        return None, f"the Flight Recorder dump is not readable: {type(exc).__name__}: {str(exc)[:200]}"
    if isinstance(data, dict) and isinstance(data.get(NO_DUMP), str):
        return None, data[NO_DUMP][:300]  # the rank's client said why it has none
    return data, None
