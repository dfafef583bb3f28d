"""The rank's Flight Recorder dump, written on the daemon's request where torch has no
watchdog to do it (gloo, on CPU).

torch 2.13 records gloo's collectives when ``TORCH_FR_BUFFER_SIZE`` is set (the daemon
sets it), but only ProcessGroupNCCL's watchdog answers the debug-info pipe the hang
bundle writes to; a gloo rank's dump can only be had inside the process,
``torch._C._distributed_c10d._dump_fr_trace()``, from a thread other than the one
blocked in the collective (the wait releases the GIL): docs/guides/hangs.md.

So the client keeps one daemon thread blocked on a FIFO of its own,
``${TORCH_NCCL_DEBUG_INFO_PIPE_FILE}<rank>.fr.pipe`` (not NCCL's ``.pipe``: NCCL
unlinks and remakes that one). The daemon asks there when NCCL's pipe is absent; the
thread writes the pickle to the dump file the bundle reads
(``${TORCH_FR_DUMP_TEMP_FILE}<rank>``, else the old name), whole (written beside and
renamed) and bounded (``LIMIT``). Where torch is not loaded, or records nothing, it
writes a one-key pickle that says why, so the daemon does not wait out its bound.
The thread costs nothing until asked: it sleeps in ``read``.

The Python frames that issued each collective (the user's call site) are in the dump
only where the rank already loaded ``torch._dynamo`` (DDP, torch.compile): torch
symbolizes them through it, and importing it on the spot takes 3 to 6 s of a loaded
CPU (measured with torch 2.13), past the bundle's bound. Without it the dump keeps
sequence numbers, ops and sizes (what the job's blame reads); the stacks say where.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import stat
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from supervisor.core.flight import NO_DUMP
from supervisor.core.flight import OWN_PIPE_SUFFIX as SUFFIX

PIPE_ENV = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
DUMP_ENVS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")  # the new name first
LIMIT = 64 * 1024 * 1024  # bytes of a dump written (the daemon reads no more)


def paths(environ: Mapping[str, str], rank: int) -> tuple[Path, Path] | None:
    """(the request FIFO, the dump file) of ``rank``, or None when the daemon set neither."""
    stem = environ.get(PIPE_ENV)
    dump = next((environ[k] for k in DUMP_ENVS if environ.get(k)), None)
    if not stem or not dump:
        return None
    return Path(f"{stem}{rank}{SUFFIX}"), Path(f"{dump}{rank}")


def install(environ: Mapping[str, str], rank: int) -> threading.Thread | None:
    """Start the thread that answers dump requests; None where there is nothing to answer."""
    where = paths(environ, rank)
    if where is None:
        return None
    pipe, dump = where
    try:
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISFIFO(pipe.lstat().st_mode):
                return None  # not ours to replace
            pipe.unlink()  # a previous generation's (its reader is gone)
        os.mkfifo(pipe, 0o600)
        # read and write: the thread then blocks in read() until a byte comes, and a
        # writer that closes never leaves the FIFO at end-of-file (a busy loop)
        fd = os.open(pipe, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    thread = threading.Thread(target=_serve, args=(fd, dump), name="ft-flight-recorder", daemon=True)
    thread.start()
    return thread


def _serve(fd: int, dump: Path) -> None:
    while True:
        try:
            if not os.read(fd, 64):
                return
        except OSError:
            return
        with contextlib.suppress(Exception):  # a dump that fails must never touch training
            _write(dump, _dump())


def _dump() -> bytes:
    """The recorder's pickle, or a pickle that says why there is none."""
    torch = sys.modules.get("torch")
    if torch is None:
        return _none("torch is not loaded in this rank")
    traced = "torch._dynamo" in sys.modules  # else symbolizing the frames imports it: seconds
    try:
        raw = torch._C._distributed_c10d._dump_fr_trace(includeStackTraces=traced)
    except Exception as exc:  # not built with it, or nothing to record: either is a reason
        return _none(f"the Flight Recorder could not dump: {type(exc).__name__}: {str(exc)[:200]}")
    if not isinstance(raw, bytes):
        return _none(f"the Flight Recorder gave {type(raw).__name__}, not a pickle")
    if len(raw) > LIMIT:
        return _none(f"the Flight Recorder dump is over {LIMIT} bytes")
    return raw


def _none(why: str) -> bytes:
    return pickle.dumps({NO_DUMP: why})


def _write(dump: Path, data: bytes) -> None:
    tmp = dump.with_name(f".{dump.name}.{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(dump)  # the daemon never reads half a dump
