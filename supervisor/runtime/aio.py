"""Small asyncio helpers the runtime shares."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


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
