"""The ranks' snapshot requests (``client.snapshot`` / ``client.restore``), answered on their
socket from the snapshots the daemon holds (``runtime.services.held_snapshots``).

Most answers are immediate. A begin that grows a slot file is answered once the file's
pages are reserved, in a thread: by then the inbox is handling other ranks' messages,
so the answer goes to the identity that asked, kept with the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from supervisor.runtime.lifecycle.inbox import Inbox
from supervisor.runtime.services.held_snapshots import Answer, SnapshotMessage, no_snapshots
from supervisor.transport import schema
from supervisor.transport.schema import Dropped

Handler = Callable[[SnapshotMessage, Collection[int]], Answer]


class SnapshotRequests:
    def __init__(self, inbox: Inbox, *, failed: Callable[[schema.RankMessage, Exception], None]) -> None:
        self._inbox = inbox
        self._failed = failed  # a bug in a deferred answer: said as the monitor says its own
        # the daemon's snapshots, given the node's ranks now; it raises Dropped for what it ignores
        self.handler: Handler = no_snapshots
        self._deferred: set[asyncio.Task[None]] = set()  # answers waiting on a reservation

    def answer(self, m: SnapshotMessage, ranks: Collection[int]) -> None:
        try:
            answer = self.handler(m, ranks)
        except Dropped as dropped:
            self._inbox.drop(dropped)
            return
        if answer is None or isinstance(m, schema.SnapshotDone | schema.Resumed):
            return  # a done, or where a rank resumed from, has no answer
        if isinstance(answer, dict):
            self._inbox.ack(m.id, **answer)
            return
        task = asyncio.ensure_future(self._when_ready(m, answer, self._inbox.identity))
        self._deferred.add(task)
        task.add_done_callback(self._deferred.discard)

    async def _when_ready(
        self, m: schema.SnapshotBegin | schema.SnapshotRestore, answer: Awaitable[dict[str, Any]],
        identity: bytes | None,
    ) -> None:  # fmt: skip
        try:
            ready = await answer
        except Exception as exc:  # the rank's wait times out; the daemon goes on
            self._failed(m, exc)
            return
        self._inbox.reply(identity, m.id, **ready)
