"""Small asyncio helpers the runtime shares."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def first(*aws: Awaitable[Any]) -> asyncio.Future[Any]:
    """Wait for the first of ``aws`` to finish; cancel the others; return it."""
    futures = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in futures:
            if not f.done():
                f.cancel()
    return next(f for f in futures if f in done)


async def in_thread(fn: Callable[[], T], name: str) -> T:
    """Run blocking ``fn`` in a daemon thread of its own.

    Unlike ``asyncio.to_thread``, a call that never returns (a rendezvous
    waiting for nodes that will not come) cannot hold up the daemon's exit.
    Cancelling the caller abandons the call; ``fn`` must then end by itself.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def work() -> None:
        value: Any
        try:
            ok, value = True, fn()
        except BaseException as exc:  # handed to the awaiting task
            ok, value = False, exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
            loop.call_soon_threadsafe(settle, ok, value)

    threading.Thread(target=work, name=name, daemon=True).start()
    return await future
