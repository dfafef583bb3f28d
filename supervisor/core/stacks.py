"""Where a rank's main thread stands, read from its Python stacks (faulthandler's dump).

When a deadline is missed, every rank of the node is asked for its stacks. In a
synchronous job the healthy ranks wait for the stuck one inside a collective;
the stuck one is somewhere else: its own code, a data loader, a file read. So
the innermost frames of each rank's *main* thread say who waits and who is stuck.

faulthandler prints, for every thread::

    Thread 0x00007f... (most recent call first):
      File "/path/x.py", line 12 in fn
    Current thread 0x00007f... (most recent call first):
      ...

Which thread is "current" is whichever one the kernel delivered the signal to,
so the main thread is found by its outermost frame instead: every other Python
thread starts in ``threading.py``'s ``_bootstrap``.

Pure: text in, a judgement out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum

_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):\s*$")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>\S+)')


class Where(IntEnum):
    """How much a rank's stack says it waits for others: lower is more likely the stuck one."""

    STOPPED = 0  # the process is stopped (SIGSTOP, a debugger) or never answered the dump
    OWN = 1  # its own code, data loading, I/O, sleeping: not waiting for a peer
    COMPUTE = 2  # inside backward or an optimizer step: DDP may be waiting for a peer there
    COLLECTIVE = 3  # inside a collective, a barrier or a store wait: waiting for a peer


@dataclass(frozen=True, slots=True)
class Frame:
    file: str
    func: str


@dataclass(frozen=True, slots=True)
class Reading:
    """One rank's main thread: where it stands and its innermost frames."""

    where: Where
    frames: tuple[Frame, ...]  # innermost first
    why: str  # the frame that decided, for the event

    @property
    def signature(self) -> tuple[Frame, ...]:
        """What ranks waiting at the same place share: their innermost frames."""
        return self.frames[:4]


# Where a rank waits for its peers. Only the innermost frames count: a waiting
# rank sits in the collective's own frames (the wait itself is native code).
_COLLECTIVE_FILES = (
    "torch/distributed/distributed_c10d.py",
    "torch/distributed/c10d_logger.py",
    "torch/distributed/_functional_collectives.py",
    "torch/distributed/device_mesh.py",
    "torch/distributed/rendezvous.py",
    "torch/distributed/elastic/utils/store.py",
    "torch/distributed/fsdp/",
    "torch/distributed/algorithms/",
    "lightning/fabric/utilities/distributed.py",
)
# DDP's own collectives (buffer broadcasts, the unused-parameter check) by name
_DDP_FILE = "torch/nn/parallel/distributed.py"
_DDP_WORDS = ("sync", "broadcast", "reduce", "barrier")
# Where DDP's gradient all-reduce is waited for: the backward pass (a slow
# backward looks the same, hence a level of its own), and a device synchronize
# (NCCL's collectives are waited for there, and so are slow kernels).
_COMPUTE = (
    ("torch/autograd/", ("_engine_run_backward", "run_backward", "backward")),
    ("torch/_tensor.py", ("backward",)),
    ("torch/cuda/", ("synchronize",)),
)
# frames that only pass a call through: skipped when looking for the innermost one
_PASS_THROUGH = ("contextlib.py", "torch/utils/_contextlib.py", "functools.py", "torch/_compile.py")
_THREAD_START = "threading.py"
_INNERMOST = 3


def threads(text: str) -> list[list[Frame]]:
    """Every thread's frames, innermost first, in the order the dump lists them."""
    found: list[list[Frame]] = []
    current: list[Frame] | None = None
    for line in text.splitlines():
        if _THREAD.match(line):
            current = []
            found.append(current)
        elif current is not None and (m := _FRAME.match(line)):
            current.append(Frame(m["file"], m["func"]))
    return [t for t in found if t]


def main_thread(text: str) -> list[Frame] | None:
    """The main thread: the one that did not start in threading.py (the first such)."""
    for frames in threads(text):
        if not frames[-1].file.endswith(_THREAD_START):
            return frames
    return None


def _is(frame: Frame, files: tuple[str, ...]) -> bool:
    path = frame.file.replace("\\", "/")
    return any(f in path for f in files)


def read(text: str) -> Reading | None:
    """Where the main thread stands; None when the dump has no main thread."""
    frames = main_thread(text)
    if frames is None:
        return None
    inner = tuple(f for f in frames if not _is(f, _PASS_THROUGH)) or tuple(frames)
    for frame in inner[:_INNERMOST]:
        path = frame.file.replace("\\", "/")
        if _is(frame, _COLLECTIVE_FILES) or (_DDP_FILE in path and any(w in frame.func for w in _DDP_WORDS)):
            return Reading(Where.COLLECTIVE, inner, _describe(frame))
    top = inner[0]
    if any(_is(top, (where,)) and top.func in funcs for where, funcs in _COMPUTE):
        return Reading(Where.COMPUTE, inner, _describe(top))
    return Reading(Where.OWN, inner, _describe(top))


def _describe(frame: Frame) -> str:
    return f"{frame.func} in {_short(frame.file)}"


def _short(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])
