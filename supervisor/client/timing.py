"""Each step's own work and its wait in collectives, measured inside the rank.

In a synchronous job the slow rank is the one that waits least: the others wait
for it in the gradient all-reduce. ``StepTimer`` keeps, per step, the time from
the end of the previous step to the end of this one (the period, the same on
every rank) and the part of it spent waiting; what is left is the rank's own
work, which the daemon compares across the node's ranks.

Two ways to feed it:

* ``ddp_hook``: a DDP communication hook around the all-reduce (the default one,
  or the workload's own). Each bucket is timed from when it is ready to when its
  all-reduce completes; once the step's last bucket is ready the backward pass
  has no compute left, so the time until every all-reduce completes is waiting.
  That completion is also the step's end.
* ``waited(seconds)`` for other collectives (``client.waiting()``), with the step's
  end marked by the ``step`` section closing when no DDP hook is installed.

A step in which another section opened (evaluation, checkpointing) is not
reported: its length says nothing of the rank's speed. Light: a lock, two clock
reads per bucket, one message per step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

Send = Callable[[float, float], None]  # (work, wait) in seconds


class StepTimer:
    def __init__(self, send: Send, clock: Callable[[], float] = time.perf_counter) -> None:
        self._send = send
        self._clock = clock
        self._lock = threading.Lock()  # buckets complete on the process group's threads
        self._last_end: float | None = None
        self._waited = 0.0  # this step's waits outside the gradient sync
        self._pending = 0  # bucket all-reduces in flight
        self._backward_done: float | None = None  # when the step's last bucket was ready
        self.tainted = False  # another section ran during the step: not a measure of speed
        self.ddp = False  # a DDP hook marks the steps' ends

    def bucket_ready(self, is_last: bool) -> None:
        with self._lock:
            self._pending += 1
            if is_last:
                self._backward_done = self._clock()

    def bucket_done(self) -> None:
        with self._lock:
            self._pending -= 1
            if self._pending > 0 or self._backward_done is None:
                return
            end = self._clock()
            sample = self._ended(end, end - self._backward_done)
            self._backward_done = None
        if sample is not None:
            self._send(*sample)

    def waited(self, seconds: float) -> None:
        with self._lock:
            self._waited += seconds

    def step_end(self) -> None:
        """The step ended (its section closed): only when no DDP hook marks the ends."""
        if self.ddp:
            return
        with self._lock:
            sample = self._ended(self._clock(), 0.0)
        if sample is not None:
            self._send(*sample)

    def _ended(self, end: float, sync_wait: float) -> tuple[float, float] | None:
        wait = sync_wait + self._waited
        last, self._last_end = self._last_end, end
        tainted, self.tainted, self._waited = self.tainted, False, 0.0
        if last is None or tainted:
            return None
        period = end - last
        wait = min(wait, period)
        return period - wait, wait


def ddp_hook(timer: StepTimer, inner: Callable[[Any, Any], Any] | None = None) -> Callable[[Any, Any], Any]:
    """A DDP communication hook: ``inner`` (default: DDP's own all-reduce), timed."""
    import torch  # noqa: PLC0415 - torch only here, never for a torch-free workload
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: PLC0415

    run = default_hooks.allreduce_hook if inner is None else inner

    def done(fut: Any) -> Any:
        timer.bucket_done()
        return fut.value()

    def hook(state: Any, bucket: Any) -> Any:
        timer.bucket_ready(bucket.is_last())
        return run(state, bucket).then(done)

    # DDP checks a hook's annotations as objects; this module's are strings (postponed)
    from torch.distributed import GradBucket  # type: ignore[attr-defined]  # noqa: PLC0415

    hook.__annotations__ = {"bucket": GradBucket, "return": torch.futures.Future[torch.Tensor]}
    timer.ddp = True
    return hook
