"""A snapshot's tensors on CUDA devices, copied into a slot without holding the training
thread: the slot's shared mapping is page-locked once (``cudaHostRegister``, portable), so
a device-to-host copy goes to it directly and asynchronously, enqueued on each device's
current stream: after the kernels that made the tensors, before any the training queues
later (an in-place update after ``snapshot()`` returns cannot reach the copy). The slot is
sealed, and checksummed, once the copies are done: off the training thread.

What the training thread still waits for: flattening the state and enqueuing one copy per
tensor (a non-contiguous tensor is first made contiguous on its device), and the first
snapshot into a slot page-locks it (once per mapping; CUDA first waits for the device's
queued work, as for any page-locking). On the device the copies share the
stream with the training's kernels: their time is the PCIe transfer of the state.
torch is looked up in ``sys.modules``, never imported here.
"""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass
from typing import Any

PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every device's context


@dataclass(slots=True)
class Copying:
    """Copies from CUDA devices into a slot, in flight: one event per device, recorded on
    its current stream after the copies."""

    events: list[Any]

    def wait(self) -> None:
        """Until every copy is done (each device's order: kernels queued before them first)."""
        for event in self.events:
            event.synchronize()

    def done(self) -> bool:
        return all(event.query() for event in self.events)


def after(torch: Any, devices: set[Any]) -> Copying:
    """The copies just enqueued on ``devices``' current streams."""
    events = []
    for device in devices:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        events.append(event)
    return Copying(events)


class PageLock:
    """A mapping page-locked for CUDA, once: ``failure`` says why not when the driver refused
    (copies from a device then wait, as to pageable memory)."""

    def __init__(self) -> None:
        self.address: int | None = None
        self.failure: str | None = None

    def hold(self, torch: Any, address: int, nbytes: int) -> bool:
        if self.address is None and self.failure is None:
            try:
                error = int(torch.cuda.cudart().cudaHostRegister(address, nbytes, PORTABLE))
            except (RuntimeError, AssertionError, AttributeError) as e:
                self.failure = f"{type(e).__name__}: {e}"
            else:
                if error != 0:  # (1: the mapping is not of memory CUDA can lock, a disk file's)
                    self.failure = f"cudaHostRegister failed (cudaError {error})"
                    _clear_last_error()
            self.address = address if self.failure is None else None
        return self.address is not None

    def release(self, torch: Any) -> None:
        """Before the mapping goes (no copy in flight)."""
        if self.address is not None:
            with contextlib.suppress(Exception):  # the process or its CUDA context is going
                torch.cuda.cudart().cudaHostUnregister(self.address)
            self.address = None


def _clear_last_error() -> None:
    """Reset the CUDA runtime's last error a refused registration left: torch checks it
    after its own calls and would raise it from the next one (the training's). torch's
    cudart binding has no cudaGetLastError: called in the library torch loaded."""
    with contextlib.suppress(OSError, AttributeError), open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "/libcudart.so" in path:
                ctypes.CDLL(path).cudaGetLastError()
                return
