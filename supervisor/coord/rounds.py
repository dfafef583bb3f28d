"""What the nodes of one rendezvous round write and read in its store.

Every key lives under the round's prefix, so a new round starts clean:

* ``ended_by`` / ``ended``: a node's generation ended, and why (the news and its
  detail); the others wait on ``ended`` (the store answers when it is set);
* ``claim/<rank>``, ``outcome/<rank>``, ``published``: each node's outcome, its place
  claimed once (by the node, or by another that saw it gone);
* ``decided``: every outcome of the round, published once by the node that filled
  the last place, which every node waits for;
* ``left``: the nodes done with the store when the job ends.

Blocking: called from the coordinator's threads.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import orjson

from supervisor.clock import SYSTEM, Clock
from supervisor.core.jobwide import NodeOutcome, PeerNews, lost, pack
from supervisor.core.types import Action, Reason

if TYPE_CHECKING:
    from supervisor.coord.torch_private import Snapshot
    from supervisor.coord.torchrdzv import Joined

LISTEN_SLICE = 3600.0  # seconds a blocking wait lasts before it is renewed (it logs a timeout)


def listen(joined: Joined, which: int, key: str, wake: threading.Event, name: str) -> list[Exception | None]:
    """Wait, in a thread of its own, for ``key`` to be set in the round's store; then
    set ``wake``. What it heard: [None] (the key is set), [error], or [] (woken first)."""
    heard: list[Exception | None] = []

    def listen() -> None:
        try:
            store = joined.listeners.get(which)
            while not wake.is_set():
                if store.wait([key], LISTEN_SLICE):
                    heard.append(None)
                    break
        except Exception as exc:  # the store is gone: the caller's guard names it
            heard.append(exc)
        finally:
            wake.set()

    threading.Thread(target=listen, name=name, daemon=True).start()
    return heard


def tell(joined: Joined, news: PeerNews, detail: str) -> None:
    """Tell every node of the round that its generation ends, and why."""
    joined.store.set("ended_by", orjson.dumps({"news": str(news), "detail": detail}).decode())
    joined.store.add("ended", 1)  # after: a node woken by it reads ended_by


def told(store: Any) -> tuple[PeerNews, str]:
    try:
        told = orjson.loads(store.get("ended_by"))
        return PeerNews(told["news"]), str(told["detail"])
    except (ValueError, TypeError, KeyError):
        return PeerNews.ENDED, "a peer's generation ended"


def claim(joined: Joined, n: int, outcome: NodeOutcome) -> None:
    """Publish ``outcome`` in its node's place unless that place is taken (the node
    itself, or another that saw it gone, came first); the node that fills the last
    place gathers the round."""
    rank = outcome.node_rank
    if joined.store.add(f"claim/{rank}", 1) != 1:
        return
    joined.store.set(f"outcome/{rank}", orjson.dumps(outcome.to_json()).decode())
    if outcome.action is Action.CONTINUE:
        joined.store.add("succeeded", 1)  # before "published": a node counted there is in here
    if joined.store.add("published", 1) == n:
        gather(joined, n)


def others_succeeded(joined: Joined, n: int) -> bool:
    """Did every other node of the round publish that its ranks all exited 0?"""
    return n > 1 and joined.store.add("succeeded", 0) >= n - 1


def gather(joined: Joined, n: int) -> None:
    """Publish the round's outcomes, once for all; a place claimed by a node that
    died before it wrote there counts that node as lost."""
    keys = [f"outcome/{rank}" for rank in range(n)]
    if joined.store.check(keys):  # every place written: one request for all
        outcomes = [outcome(rank, raw) for rank, raw in enumerate(joined.store.get_many(keys))]
    else:
        outcomes = [
            outcome(rank, joined.store.get(key)) if joined.store.check([key])
            else NodeOutcome(rank, Action.RESCHEDULE, Reason.NODE_LOST, "it never published its outcome")
            for rank, key in enumerate(keys)
        ]  # fmt: skip
    joined.store.set("decided", orjson.dumps(pack(outcomes)).decode())


def outcome(rank: int, raw: bytes) -> NodeOutcome:
    try:
        outcome = NodeOutcome.from_json(orjson.loads(raw))
    except (ValueError, TypeError) as exc:
        # a peer we cannot understand is a peer we cannot follow
        return NodeOutcome(rank, Action.RESCHEDULE, Reason.NODE_LOST, f"unreadable outcome: {exc}")
    return outcome


def news(snap: Snapshot, joined: Joined, bound: float, clock: Clock = SYSTEM) -> tuple[PeerNews, str] | None:
    if snap.closed:
        return PeerNews.CLOSED, "the rendezvous was closed"
    if snap.waiting:
        return PeerNews.WAITING, f"{len(snap.waiting)} node(s) waiting to join"
    others = {r: who for r, who in joined.members.items() if who != joined.me}
    gone = lost(others, snap.participants, snap.heartbeats, clock.wall(), bound)
    if gone:
        return (
            PeerNews.LOST,
            f"node(s) {sorted(gone)} stopped keeping the rendezvous alive (bound {bound:g} s)",
        )
    return None


def barrier(joined: Joined, n: int, timeout: float) -> None:
    """Wait (bounded) for every node to be done with the store: one of us hosts it.

    The last to arrive sets ``all_left`` and the store answers every node's wait at
    once; after it nobody asks the store anything, so its host may leave. (Polling a
    count, a node still between two looks asked a store whose host had just left.)"""
    if joined.store.add("left", 1) >= n:
        joined.store.set("all_left", "1")
    joined.store.wait(["all_left"], timeout)
