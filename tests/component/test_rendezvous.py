"""Our adapter over torch's elastic rendezvous, against the real thing (c10d, TCPStore).

It reads the dynamic handler's state (who is in the round, whose keep-alive is
stale): the day torch changes that shape, these tests fail, not a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from supervisor.clock import Clock
from supervisor.config.rendezvous import RdzvConfig
from supervisor.core.catalogue import Event
from supervisor.process.ports import free_port
from tests.support import wait_until

pytestmark = pytest.mark.torch
torchrdzv = pytest.importorskip("supervisor.coord.torchrdzv")
Make = Callable[..., Any]
PAUSED: list[float] = []


class Noting(Clock):
    """The system's clock, noting every pause (the rendezvous' waits between looks)."""

    def pause(self, seconds: float) -> None:
        PAUSED.append(seconds)
        super().pause(seconds)


def config(endpoint: str, run_id: str) -> RdzvConfig:
    conf = {"is_host": "0", "keep_alive_interval": "1", "last_call_timeout": "1", "join_timeout": "30"}
    return RdzvConfig("c10d", endpoint, run_id, 2, 2, local_addr="127.0.0.1", conf=conf)


@pytest.fixture
def made() -> Iterator[Make]:
    """Nodes made for a test leave with it: their keep-alive threads would beat on in
    this worker, against a store that is gone, into the next tests' output."""
    nodes: list[Any] = []

    def make(cfg: RdzvConfig, clock: Clock | None = None) -> Any:
        nodes.append(torchrdzv.TorchRendezvous(cfg, *([] if clock is None else [clock])))
        return nodes[-1]

    yield make
    for node in nodes:
        with contextlib.suppress(Exception):
            node.leave()


def join_both(a: object, b: object, generation: int) -> list[object]:
    results: list[object] = [None, None]

    def join(i: int, r: object) -> None:
        results[i] = r.join(generation, free_port())  # type: ignore[attr-defined]

    threads = [threading.Thread(target=join, args=(i, r)) for i, r in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None for r in results), "a node never completed the rendezvous"
    return results


def test_two_nodes_agree_on_the_round_and_the_master(endpoint: str, made: Make) -> None:
    a = made(config(endpoint, "r1"))
    b = made(config(endpoint, "r1"))
    ja, jb = join_both(a, b, 0)
    assert {ja.node_rank, jb.node_rank} == {0, 1} and ja.nnodes == jb.nnodes == 2
    assert ja.members == jb.members and set(ja.members.values()) == {ja.me, jb.me}
    assert (
        (ja.master_addr, ja.master_port) == (jb.master_addr, jb.master_port) == ("127.0.0.1", ja.master_port)
    )
    # what one publishes under the round's prefix, the other reads
    ja.store.set("outcome/x", "hello")
    assert jb.store.get("outcome/x") == b"hello"
    # ... and so do the connections of its own a node waits on (torch's round prefix)
    for which in (0, 1):
        assert jb.listeners.get(which).wait(["outcome/x"], 5)
        assert not jb.listeners.get(which).wait(["outcome/never"], 0.1)
    assert jb.listeners.get(0) is not jb.store

    snap = a.snapshot()
    assert snap.complete and not snap.closed and snap.round == ja.round
    assert snap.participants == {who: rank for rank, who in ja.members.items()}
    assert all(time.time() - snap.heartbeats[who] < 5 for who in ja.members.values())

    b.leave()  # stepping out: the others need not wait for its keep-alive to go stale
    assert jb.me not in a.snapshot().participants
    a.close()
    assert b.snapshot().closed


def test_on_the_static_backend_a_nodes_listeners_hear_what_the_round_wrote(made: Make) -> None:
    """torch's static store is prefixed by the run id; a listener's own connection must read
    under the same prefix, or no node ever hears a round's news or its decision."""
    port = free_port()
    nodes = [made(RdzvConfig("static", f"127.0.0.1:{port}", "s1", 2, 2, node_rank=k)) for k in (0, 1)]
    ja, jb = join_both(*nodes, 0)
    assert (ja.node_rank, jb.node_rank) == (0, 1)
    ja.store.set("decided", "[]")
    for joined in (ja, jb):
        for which in (0, 1):
            assert joined.listeners.get(which).wait(["decided"], 5), (joined.node_rank, which)
            assert not joined.listeners.get(which).wait(["never"], 0.1)


def test_a_node_that_joins_later_takes_the_place_of_one_that_left(
    endpoint: str, made: Make
) -> None:
    a = made(config(endpoint, "r2"))
    b = made(config(endpoint, "r2"))
    first = join_both(a, b, 0)
    b.leave()
    c = made(config(endpoint, "r2"))
    ja, jc = join_both(a, c, 1)
    assert ja.round == first[0].round + 1  # type: ignore[attr-defined]
    assert {ja.node_rank, jc.node_rank} == {0, 1}
    # the newcomer reads the master node 0 published for this round (torch's shared
    # agent store would have it wait forever: see TorchRendezvous)
    assert (jc.master_addr, jc.master_port) == (ja.master_addr, ja.master_port)


def test_an_unreachable_store_is_named() -> None:
    cfg = RdzvConfig(
        "c10d", f"127.0.0.1:{free_port()}", "r3", 2, 2, conf={"is_host": "0", "read_timeout": "1"}
    )
    with pytest.raises(torchrdzv.RendezvousEnded, match="cannot reach the rendezvous at"):
        torchrdzv.TorchRendezvous(cfg)


def test_a_restart_round_looks_at_the_state_often_and_uncached_then_at_torchs_pace(
    endpoint: str, made: Make
) -> None:
    # torch polls its state once a second and caches it for a second: a restart round of
    # nodes that all decided together waited out both (1.2-1.6 s for 2 nodes, 2.6 s for 4)
    import inspect  # noqa: PLC0415

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn  # noqa: PLC0415

    from supervisor.coord import pace  # noqa: PLC0415

    source = inspect.getsource(dyn)
    assert "_delay(seconds=1)" in source and "cache_duration: int = 1" in source  # what we pace
    PAUSED.clear()
    a = made(config(endpoint, "r3"), Noting())
    b = made(config(endpoint, "r3"), Noting())
    join_both(a, b, 0)
    for r in (a, b):  # restarting: leave together, join again
        r.leave()
    ja, jb = join_both(a, b, 1)
    assert ja.round == jb.round and ja.members == jb.members
    # every look in the rounds came quickly; a write that lost the race backed off for less
    assert pace.FAST_POLL in PAUSED and all(p <= pace.FAST_POLL for p in PAUSED), PAUSED
    holder = a._handler._state_holder
    assert holder._cache == 1.0 and not holder._window.quick()  # torch's cache is back between rounds
    assert holder._inner._cache_duration == 0  # torch's holder, made uncached: ours caches
    # a large job looks less often, so that the store sees the same load in all
    assert pace.Pace().interval(2000) == 1.0
    assert pace.Pace().interval(100) == pytest.approx(0.2)


def _ours(value: object) -> bool:
    module = getattr(value, "__module__", None)
    return isinstance(module, str) and (module == "supervisor" or module.startswith("supervisor."))


def test_importing_our_rendezvous_changes_nothing_of_torchs(endpoint: str, made: Make) -> None:
    # it used to replace torch's poll delay for every user of torch in the process. Checked
    # here, not in a fresh interpreter (which paid a whole torch import, ~2.7 CPU-s, for it):
    # nothing of torch's is ours, whatever imported us before; and our modules' code, run
    # again from scratch, changes nothing of torch's
    from torch.distributed.elastic.rendezvous import api, utils  # noqa: PLC0415
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn  # noqa: PLC0415

    def spaces() -> list[dict[str, Any]]:
        found = [vars(dyn), vars(utils), vars(api), api.rendezvous_handler_registry._registry]
        return found + [vars(c) for c in vars(dyn).values() if isinstance(c, type)]

    def seen() -> list[dict[str, int]]:
        return [{k: id(v) for k, v in space.items()} for space in spaces()]

    registered = api.rendezvous_handler_registry._registry
    planted = [k for space in spaces() for k, v in space.items() if _ours(v)]
    # our own names in torch's registry are ours on purpose (torchrdzv.register, when a job needs them)
    assert set(planted) <= set(torchrdzv.NAMES.values()), planted
    assert all(_ours(registered[name]) for name in planted)
    before = seen()
    mine = {n: m for n, m in sys.modules.items() if n == "supervisor" or n.startswith("supervisor.")}
    try:
        for name in mine:
            del sys.modules[name]
        importlib.import_module("supervisor.coord.torchrdzv")
        after = seen()
    finally:  # this worker's other tests keep the modules (and classes) they already hold
        for name in [n for n in sys.modules if n == "supervisor" or n.startswith("supervisor.")]:
            del sys.modules[name]
        sys.modules.update(mine)
    pairs = zip(before, after, strict=False)
    changed = sorted({k for b, a in pairs for k in b.keys() | a.keys() if b.get(k) != a.get(k)})
    assert after == before, f"torch changed on import: {changed}"
    assert dyn._delay is utils._delay

    # nor while our nodes join: a handler torch makes keeps torch's pace and cache
    from torch.distributed.elastic.rendezvous import (  # noqa: PLC0415
        RendezvousParameters,
        c10d_rendezvous_backend,
        dynamic_rendezvous,
        utils,
    )

    a = made(config(endpoint, "r7"))
    b = made(config(endpoint, "r7"))
    early = threading.Thread(target=a.join, args=(0, free_port()), daemon=True)
    early.start()  # a waits for b, in its quick window
    wait_until(lambda: a.snapshot().participants, 10, "a to be in the round")
    params = RendezvousParameters("c10d", endpoint, "torchs", 1, 1, local_addr="127.0.0.1", is_host="0")
    dyn = dynamic_rendezvous
    theirs = dyn.create_handler(*reversed(c10d_rendezvous_backend.create_backend(params)), params)
    assert dyn._delay is utils._delay
    assert theirs._state_holder._cache_duration == 1
    assert type(theirs._state_holder) is dyn._BackendRendezvousStateHolder
    assert type(theirs._op_executor) is dyn._DistributedRendezvousOpExecutor
    b.join(0, free_port())
    early.join(30)
    assert theirs._state_holder._cache_duration == 1 and dyn._delay is utils._delay


def test_on_a_torch_it_does_not_know_the_rendezvous_is_torchs_own_and_says_so(
    endpoint: str, monkeypatch: pytest.MonkeyPatch, made: Make
) -> None:
    import torch  # noqa: PLC0415

    from supervisor.coord import torch_private  # noqa: PLC0415
    from supervisor.coord.job import RendezvousJob  # noqa: PLC0415

    monkeypatch.setattr(torch_private, "KNOWN", "2.12")
    events: list[Event] = []

    class Sink:
        def emit(self, event: Event, level: int | None = None) -> None:
            events.append(event)

    asyncio.run(RendezvousJob(config(endpoint, "r8"), None, Sink()).start())
    assert [(e.NAME, e.LEVEL) for e in events] == [("rendezvous_fallback", logging.WARNING)]
    fields = events[0].as_dict()
    assert fields["torch"] == torch.__version__ and "2.12" in fields["why"]
    # torch's handler as it is (under our name), and the round still works
    PAUSED.clear()
    a = made(config(endpoint, "r6"), Noting())
    b = made(config(endpoint, "r6"), Noting())
    assert type(a._handler) is torch_private.Handler and a.fallback
    assert a._handler.get_backend() == "ft-supervisor-c10d"
    ja, jb = join_both(a, b, 0)
    assert ja.members == jb.members and {ja.me, jb.me} == set(ja.members.values())
    assert PAUSED == []  # no quick looks: torch's own second
    assert a._handler._keep_alive_timer is not None  # torch's own keep-alive timer
    b.leave()
    assert jb.me not in a.snapshot().participants


def test_the_torch_it_knows_is_named_by_its_major_and_minor_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor.coord import torch_private  # noqa: PLC0415

    monkeypatch.setattr(torch_private, "KNOWN", "2.13")
    assert all(torch_private.unknown(v) is None for v in ("2.13", "2.13.0", "2.13.1+cpu", "2.13.0a0+git1"))
    for other in ("2.12.1", "2.14.0+cpu", "2.130.0", "3.13"):
        why = torch_private.unknown(other)
        assert why is not None and other in why and "2.13" in why


class _EtcdLikeError(Exception):
    """Stands for python-etcd's errors: what makes them transient is their module."""


_EtcdLikeError.__module__ = "etcd"


def test_patience_rides_out_a_transient_store_error_within_its_bound() -> None:
    from supervisor.coord.torchrdzv import Patience, RendezvousEnded  # noqa: PLC0415

    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    patience = Patience(5.0, sleep=sleep, clock=lambda: now[0])
    failures = iter([_EtcdLikeError("etcdserver: request timed out")] * 3)

    def flaky() -> int:
        err = next(failures, None)
        if err is not None:
            raise err
        return 7

    assert patience(flaky, "add ended") == 7
    assert slept == [0.1, 0.2, 0.4]  # backing off
    with pytest.raises(RendezvousEnded, match="add ended: the store kept failing for 5 s"):
        patience(lambda: (_ for _ in ()).throw(_EtcdLikeError("no leader")), "add ended")
    assert now[0] <= 0.7 + 5.0
    # a c10d store's error is its host gone: never retried
    with pytest.raises(RuntimeError):
        patience(lambda: (_ for _ in ()).throw(RuntimeError("Connection reset by peer")), "get")
    impatient = Patience(0.0, sleep=sleep, clock=lambda: now[0])
    with pytest.raises(RendezvousEnded):
        impatient(lambda: (_ for _ in ()).throw(_EtcdLikeError("x")), "get")


def test_each_node_keeps_alive_at_its_own_phase_not_all_at_once(
    endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch starts every node's keep-alive timer when the round completes: the whole job
    # rewrote the rendezvous state at the same instant each interval, each write making
    # the others' stale (2.5 compare-and-sets a keep-alive at 256 nodes: scale.py)
    import random  # noqa: PLC0415

    from supervisor.coord import keepalive  # noqa: PLC0415

    monkeypatch.setattr(keepalive, "RNG", random.Random(2))  # four phases 0.06 .. 0.96 of 1 s
    conf = {"is_host": "0", "keep_alive_interval": "1", "last_call_timeout": "1", "join_timeout": "30"}
    nodes = [
        torchrdzv.TorchRendezvous(RdzvConfig("c10d", endpoint, "r5", 4, 4, local_addr="127.0.0.1", conf=conf))
        for _ in range(4)
    ]
    beats: list[list[float]] = [[] for _ in nodes]
    started: dict[int, float] = {}  # handler -> when its timer started (the round completed)
    start = keepalive.Phased.start

    def timed(timer: keepalive.Phased) -> None:
        started[id(timer._owner())] = time.monotonic()
        start(timer)

    monkeypatch.setattr(keepalive.Phased, "start", timed)

    def join(i: int) -> None:
        node = nodes[i]
        beat = node._handler._keep_alive

        def noted() -> None:
            beats[i].append(time.monotonic())
            beat()

        node._handler._keep_alive = noted  # torch's timer and ours both call it by name
        node.join(0, free_port())

    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(nodes))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(started) == len(nodes), "a node never completed the rendezvous"
        wait_until(lambda: all(len(b) >= 2 for b in beats), 10, "every node to beat twice")
        # after its round completed (its timer's start, not join()'s return: a loaded
        # machine returned from join after a 0.06 s phase had already beaten once)
        firsts = [b[0] - started[id(n._handler)] for b, n in zip(beats, nodes, strict=True)]
        assert all(0.0 <= f < 1.3 for f in firsts), firsts  # within the interval (and a scheduling slack)
        assert max(b[0] for b in beats) - min(b[0] for b in beats) > 0.5, firsts  # spread, not a burst
        assert all(b[1] - b[0] == pytest.approx(1.0, abs=0.3) for b in beats)  # then torch's interval
        snap = nodes[0].snapshot()
        assert all(time.time() - snap.heartbeats[who] < 2.5 for who in snap.participants)  # nobody stale
    finally:  # a node left open beats on from its thread into the next tests of this worker
        for node in nodes:
            node.close()


def test_the_first_keep_alive_waits_until_torch_has_read_the_round(
    endpoint: str, made: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A keep-alive syncs the shared state and drops dead nodes from it in place. torch
    # asks for the keep-alive before it reads the round (its world, its store) and we
    # read it after (members()): with a first beat at a phase near 0 the two raced, and
    # at 1,024 simulated nodes a join failed ("dictionary changed size during iteration")
    from supervisor.coord import keepalive  # noqa: PLC0415

    monkeypatch.setattr(keepalive, "phase", lambda interval: 0.0)  # the earliest phase there is
    conf = {"is_host": "0", "keep_alive_interval": "1", "last_call_timeout": "1", "join_timeout": "30"}
    node = made(RdzvConfig("c10d", endpoint, "r8", 1, 1, local_addr="127.0.0.1", conf=conf))
    handler = node._handler
    timers_while_torch_reads: list[object] = []
    get_store, beat = handler._get_store, handler._keep_alive
    beats: list[float] = []

    def reading() -> Any:  # torch's next_rendezvous, right after it asked for the keep-alive
        timers_while_torch_reads.append(handler._beats)
        return get_store()

    def noted() -> None:
        beats.append(time.monotonic())
        beat()

    handler._get_store, handler._keep_alive = reading, noted
    joined = node.join(0, free_port())
    assert timers_while_torch_reads == [None]  # no beat could run while torch read the round
    assert joined.members == {0: joined.me}
    wait_until(lambda: len(beats) >= 1, 10, "the first beat, at once after the join")


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ({"keep_alive_interval": "60"}, 30),
        ({"keep_alive_interval": "1"}, 5),
        ({"keep_alive_interval": "60", "heartbeat_timeout": "7"}, 7),
    ],
)
def test_a_keep_alive_may_take_half_its_interval(
    endpoint: str, made: Make, given: dict[str, str], seconds: int
) -> None:
    # torch's fixed 5 s failed hundreds of keep-alives at rest at 1,024 nodes (scale.py):
    # writers contend for the one state, and a node is called dead only after interval x attempts
    conf = {"is_host": "0", **given}
    node = made(RdzvConfig("c10d", endpoint, f"hb{seconds}", 1, 1, local_addr="127.0.0.1", conf=conf))
    assert node._handler.settings.timeout.heartbeat.total_seconds() == seconds


def test_a_node_running_another_number_of_ranks_closes_the_job_with_an_abort(endpoint: str) -> None:
    """Each node numbers its ranks from its own --nproc-per-node: two that differ would give
    two ranks one number. The node that finds it different ends the job for every node."""
    from supervisor.coord.job import JobOver, RendezvousJob  # noqa: PLC0415
    from supervisor.core.jobwide import NodeOutcome, PeerNews  # noqa: PLC0415
    from supervisor.core.types import Action, Reason  # noqa: PLC0415

    class Sink:
        def emit(self, event: Event, level: int | None = None) -> None:
            pass

    async def both() -> tuple[Any, Any, list[Any], BaseException | None]:
        jobs = [RendezvousJob(config(endpoint, "r9"), None, Sink(), nproc=n) for n in (1, 2)]
        await asyncio.gather(*(j.start() for j in jobs))
        joins = [asyncio.ensure_future(j.join(0)) for j in jobs]
        # the node that set the count completes its join; the other waits, as the host of
        # the store may, for the others to be done with it
        done, _ = await asyncio.wait(joins, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        k = joins.index(done.pop())
        node, job_gen = jobs[k], joins[k].result()
        # its ranks would be running: it hears that the job ends, and why
        news = await asyncio.wait_for(node.watch(job_gen), 30)
        why = node._closed_reason()
        own = NodeOutcome(job_gen.node_rank, Action.RESTART, Reason.PEER_FAILED, news[1])
        outcomes = await asyncio.wait_for(node.agree(job_gen, own), 30)
        await node.finish(job_gen, Action.ABORT, job_over=True, live=2)  # as the daemon does
        other = await asyncio.wait_for(asyncio.gather(joins[1 - k], return_exceptions=True), 30)
        return news, why, outcomes, other[0]

    news, why, outcomes, over = asyncio.run(both())
    assert isinstance(over, JobOver), over  # the node that differs: the abort, saying why
    assert (over.action, over.reason) == (Action.ABORT, Reason.LAYOUT)
    assert "rank(s) and another node of the job" in over.detail and "--nproc-per-node" in over.detail
    # the other heard it at once (or saw the rendezvous closed at a look just before), and
    # the agreement holds the abort: every node's joint decision is to abort
    assert news[0] in (PeerNews.ENDED, PeerNews.CLOSED) and why is Action.ABORT, news
    layout = [(o.action, o.reason) for o in outcomes if o.reason is Reason.LAYOUT]
    assert layout == [(Action.ABORT, Reason.LAYOUT)], outcomes


def test_the_first_count_is_kept_with_or_without_the_stores_compare_and_set(endpoint: str) -> None:
    """TCPStore sets a missing key by compare-and-set; etcd's EtcdStore, a Store written
    in Python, has none ("Not implemented"), and the first to count itself sets it."""
    from torch.distributed import HashStore, Store, TCPStore  # noqa: PLC0415

    class WithoutCompareSet(Store):  # type: ignore[misc] # as EtcdStore: torch's Store in Python
        def __init__(self) -> None:
            super().__init__()
            self.inner = HashStore()

        def set(self, key: str, value: str) -> None:
            self.inner.set(key, value)

        def get(self, key: str) -> bytes:
            return bytes(self.inner.get(key))

        def add(self, key: str, value: int) -> int:
            return int(self.inner.add(key, value))

        def wait(self, keys: list[str], timeout: Any = None) -> None:
            self.inner.wait(keys, timeout)

    host, port = endpoint.rsplit(":", 1)
    tcp = TCPStore(host, int(port), is_master=False, wait_for_workers=False)
    without = WithoutCompareSet()
    with pytest.raises(RuntimeError, match="Not implemented"):
        without.compare_set("k", "", "1")
    for raw in (tcp, without):
        store = torchrdzv.PatientStore(raw, torchrdzv.Patience(0.0))
        assert [store.first("nproc", n) for n in ("2", "4", "2")] == ["2", "2", "2"], raw
