"""The job's node table: what this node publishes of itself, and when."""

from __future__ import annotations

from typing import Any

import orjson

from supervisor.coord.nodetable import NodeTable


class Store:
    """torch's store as the table uses it, every call recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.keys: dict[str, bytes] = {}
        self.counter = 0

    def add(self, key: str, n: int) -> int:
        self.calls.append(("add", key))
        self.counter += n
        return self.counter

    def set(self, key: str, value: str) -> None:
        self.calls.append(("set", key))
        self.keys[key] = value.encode()


def _published(store: Store) -> dict[str, Any]:
    return orjson.loads(store.keys["node/0"])  # type: ignore[no-any-return]


def test_a_noted_state_waits_for_a_rendezvous_thread_to_publish_it() -> None:
    # the daemon notes its state from its loop: a store request there held the loop for a
    # round trip, or for the store's patience when its host was gone
    store = Store()
    table = NodeTable(lambda: store)
    table.register()  # the join's thread: a slot, and the status so far
    assert store.calls == [("add", "nodes"), ("set", "node/0")]
    table.note("running", generation=0)
    table.note("agreeing", outcome="restart")
    assert len(store.calls) == 2  # nothing from the loop
    table.publish_shared()  # the next thread that talks to the store
    assert store.calls[2:] == [("set", "node/0")]
    assert _published(store)["state"] == "agreeing" and _published(store)["generation"] == 0
    table.publish_shared()
    assert len(store.calls) == 3  # nothing new, nothing sent


def test_a_note_before_the_node_has_a_slot_is_published_when_it_takes_one() -> None:
    store = Store()
    table = NodeTable(lambda: store)
    table.note("joining", generation=0)
    assert store.calls == []
    table.register()
    assert _published(store)["state"] == "joining"
    table.publish_shared()
    assert len(store.calls) == 2  # register published it already


def test_a_status_the_store_refused_is_sent_again_at_the_next_publish() -> None:
    store = Store()
    table = NodeTable(lambda: store)
    table.register()
    real_set = store.set

    def refused(key: str, value: str) -> None:
        raise ConnectionError("the store's host is gone")

    store.set = refused  # type: ignore[method-assign]
    table.note("running", generation=1)
    table.publish_shared()  # refused: kept as unpublished
    store.set = real_set  # type: ignore[method-assign]
    table.publish_shared()
    assert _published(store)["state"] == "running"
