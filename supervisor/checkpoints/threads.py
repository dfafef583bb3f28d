"""Worker threads for checkpoint IO that never hold up the daemon's exit."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")
_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonThreads(Executor):
    """A small pool of *daemon* threads, for aiofiles and fsspec calls.

    Not the loop's default executor nor a ThreadPoolExecutor: both are joined when the
    process exits (``asyncio.Runner`` waits for the default executor, the interpreter
    for every pool thread), so one ``write`` stuck on a hung mount (an NFS hard mount,
    a FUSE bucket) would keep the daemon, and its exit code for the scheduler, forever.
    A call abandoned at the final sync's deadline is left behind here instead.

    A thread is added whenever none is idle (up to ``max_workers``): a call stuck in
    the kernel holds its thread, and the cleanup after it must still find one.
    """

    def __init__(self, max_workers: int = 8, name: str = "ft-checkpoints") -> None:
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._max = max_workers
        self._name = name
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit after shutdown")
            self._work.put((future, fn, args, kwargs))
            if self._idle == 0 and len(self._threads) < self._max:
                thread = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}")
                thread.daemon = True
                thread.start()
                self._threads.append(thread)
        return future

    def _run(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            item = self._work.get()
            with self._lock:
                self._idle -= 1
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # handed to whoever awaits the future
                future.set_exception(exc)

    def shutdown(self, wait: bool = False, *, cancel_futures: bool = False) -> None:
        """Stop the threads once the queued work is done; never waits by default."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._threads:
                self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
