"""The job a node belongs to: alone (one node), or a rendezvous of daemons.

The daemon asks the same five things of either: ``join`` the next round (node
rank, world, master address), ``watch`` the peers while its ranks run,
``announce_end`` of its generation, ``agree`` on the round's outcomes, and
``finish`` (leave, or close the job). Everything a node publishes lives in the
rendezvous store under the round's prefix; torch's blocking calls run in
threads so the event loop never waits on the network.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from supervisor.aio import in_thread
from supervisor.config.rendezvous import RdzvConfig
from supervisor.core.jobwide import NodeOutcome, PeerNews, lost
from supervisor.core.types import Action, EventSink, Reason
from supervisor.process.ports import free_port

if TYPE_CHECKING:
    from supervisor.coord.torchrdzv import Joined, Snapshot, TorchRendezvous

T = TypeVar("T")
STATE_EVERY = 1.0  # seconds between reads of the rendezvous state (torch caches it for 1 s too)
SPARES_NOTICE = 2.5  # seconds nodes waiting in the rendezvous get to see it closed
EXIT_BARRIER = 5.0  # seconds the last nodes wait for each other before the store host leaves


@dataclass(frozen=True, slots=True)
class JobGeneration:
    """One generation's place in the job."""

    generation: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    rdzv_round: int = 0
    joined: Joined | None = None
    restarts_used: int = 0  # by the job so far, as the rendezvous store counts them


class JobOver(Exception):
    """The job cannot go on with this node: leave with ``action``."""

    def __init__(self, action: Action, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.action, self.reason, self.detail = action, reason, detail


class LocalJob:
    """A single-node job: no peers, no rendezvous, no torch in the daemon."""

    multi = False

    def __init__(self, master_addr: str, master_port: int | None) -> None:
        self._addr, self._port = master_addr, master_port

    async def start(self) -> bool:
        return True

    async def join(self, generation: int) -> JobGeneration:
        return JobGeneration(generation, 0, 1, self._addr, self._port or free_port())

    async def watch(self, job_gen: JobGeneration) -> tuple[PeerNews, str]:
        await asyncio.Event().wait()  # a node alone never hears news
        raise AssertionError("unreachable")

    async def announce_end(self, job_gen: JobGeneration, why: str) -> None:
        return None

    async def agree(self, job_gen: JobGeneration, own: NodeOutcome) -> list[NodeOutcome]:
        return [own]

    async def publish(self, job_gen: JobGeneration, own: NodeOutcome) -> None:
        return None

    async def count_restart(self) -> None:
        return None

    async def finish(
        self, job_gen: JobGeneration | None, action: Action, *, job_over: bool, live: int = 1
    ) -> None:
        return None

    def note(self, state: str, **fields: Any) -> None:
        return None

    def nodes(self) -> list[dict[str, Any]]:
        return []

    def share(self, **fields: Any) -> None:
        """Nothing to share with: a single node."""


class RendezvousJob:
    """One node of a multi-node job, through torch's elastic rendezvous."""

    multi = True

    def __init__(self, cfg: RdzvConfig, master_port: int | None, events: EventSink) -> None:
        self.cfg = cfg
        self._master_port = master_port
        self._events = events
        self._rdzv: TorchRendezvous | None = None
        self._slot: int | None = None  # this daemon's entry in the job's node table
        self._status: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
        self._nodes: list[dict[str, Any]] = []
        self._unpublished = False  # shared fields the watcher has not published yet
        self._lock = threading.Lock()

    # -- the rendezvous ----------------------------------------------------------------

    async def start(self) -> bool:
        """Import torch and reach the rendezvous store (raises JobOver)."""

        def connect() -> TorchRendezvous:
            from supervisor.coord.torchrdzv import RendezvousEnded, TorchRendezvous  # noqa: PLC0415

            try:
                return TorchRendezvous(self.cfg)
            except RendezvousEnded as exc:
                raise JobOver(Action.RESCHEDULE, Reason.RENDEZVOUS_LOST, str(exc)) from None

        self._rdzv = await in_thread(connect, "rdzv-connect")
        return True

    async def join(self, generation: int) -> JobGeneration:
        rdzv = self._rdzv
        assert rdzv is not None, "start() first"
        self.note("joining", generation=generation)

        def join() -> tuple[Joined, int]:
            from supervisor.coord.torchrdzv import RendezvousEnded  # noqa: PLC0415

            try:
                joined = rdzv.join(generation, self._master_port or free_port())
            except RendezvousEnded as exc:
                raise self._ended(exc.kind, str(exc)) from None
            self._register()
            return joined, int(rdzv.base.add("restarts", 0))

        joined, used = await in_thread(self._guard(join), f"rdzv-join-{generation}")
        self._events.emit(
            "rendezvous_joined",
            generation=generation,
            round=joined.round,
            node_rank=joined.node_rank,
            nnodes=joined.nnodes,
            master_addr=joined.master_addr,
            master_port=joined.master_port,
            restarts_used=used,
        )
        return JobGeneration(
            generation,
            joined.node_rank,
            joined.nnodes,
            joined.master_addr,
            joined.master_port,
            joined.round,
            joined,
            used,
        )

    async def count_restart(self) -> None:
        """One node per round counts a restart the job spent, for nodes that join later."""
        rdzv = self._rdzv_or_fail()
        await in_thread(self._guard(lambda: rdzv.base.add("restarts", 1)), "rdzv-count")

    def _ended(self, kind: str, detail: str) -> JobOver:
        if kind == "closed":
            why = self._closed_reason()
            if why is not None:
                return JobOver(why, Reason.PEER_FAILED, f"{detail}; the job ended with {why}")
            return JobOver(Action.CONTINUE, Reason.PEER_FAILED, detail)
        reason = Reason.RENDEZVOUS_TIMEOUT if kind == "timeout" else Reason.RENDEZVOUS_LOST
        return JobOver(Action.RESCHEDULE, reason, detail)

    def _closed_reason(self) -> Action | None:
        try:
            base = self._rdzv_or_fail().base
            if base.check(["closed"]):
                return Action(orjson.loads(base.get("closed"))["action"])
        except Exception:
            return None
        return None

    def _guard(self, fn: Callable[[], T]) -> Callable[[], T]:
        """A store that fails (its host is gone) ends this node's part in the job."""

        def guarded() -> T:
            from supervisor.coord.torchrdzv import RendezvousEnded  # noqa: PLC0415 - torch is loaded by now

            try:
                return fn()
            except RendezvousEnded as exc:  # a distributed store that kept failing
                raise self._ended(exc.kind, str(exc)) from None
            except (RuntimeError, TimeoutError, OSError) as exc:
                raise JobOver(
                    Action.RESCHEDULE,
                    Reason.RENDEZVOUS_LOST,
                    f"the rendezvous store at {self.cfg.endpoint} is unreachable: {exc}",
                ) from None

        return guarded

    def _rdzv_or_fail(self) -> TorchRendezvous:
        if self._rdzv is None:
            raise RuntimeError("the rendezvous is not started")
        return self._rdzv

    # -- while the ranks run -------------------------------------------------------------

    async def watch(self, job_gen: JobGeneration) -> tuple[PeerNews, str]:
        """Return the first news that ends this node's generation."""
        stop = threading.Event()
        try:
            return await in_thread(
                self._guard(lambda: self._watch(job_gen, stop)), f"rdzv-watch-{job_gen.generation}"
            )
        finally:
            stop.set()

    def _watch(self, job_gen: JobGeneration, stop: threading.Event) -> tuple[PeerNews, str]:
        joined = _joined(job_gen)
        next_state = 0.0
        while not stop.wait(self.cfg.poll_interval):
            if joined.store.add("ended", 0) > 0:
                return PeerNews.ENDED, _text(joined.store, "ended_by", "a peer's generation ended")
            now = time.monotonic()
            if now < next_state:
                continue
            next_state = now + STATE_EVERY
            if self._unpublished and self._slot is not None:
                self._unpublished = False
                self._publish()
            self._refresh_nodes()
            snap = self._rdzv_or_fail().snapshot()
            if snap is None:
                continue
            news = _news(snap, joined, self.cfg.keep_alive_bound)
            if news is not None:
                return news
        raise _Stopped

    async def announce_end(self, job_gen: JobGeneration, why: str) -> None:
        """Tell the peers, first, that this node's generation is over."""
        joined = _joined(job_gen)

        def announce() -> None:
            joined.store.set("ended_by", f"node {job_gen.node_rank} ({self._status['host']}): {why}")
            joined.store.add("ended", 1)

        await in_thread(self._guard(announce), "rdzv-announce")

    # -- after the ranks ended -------------------------------------------------------------

    async def agree(self, job_gen: JobGeneration, own: NodeOutcome) -> list[NodeOutcome]:
        """Publish this node's outcome; return every node's (a lost node's as a reschedule)."""
        self.note("agreeing", outcome=str(own.action))
        stop = threading.Event()
        try:
            return await in_thread(
                self._guard(lambda: self._agree(job_gen, own, stop)), f"rdzv-agree-{job_gen.generation}"
            )
        finally:
            stop.set()

    def _agree(self, job_gen: JobGeneration, own: NodeOutcome, stop: threading.Event) -> list[NodeOutcome]:
        joined = _joined(job_gen)
        _put_outcome(joined, own)
        got = {own.node_rank: own}
        deadline = time.monotonic() + self.cfg.seconds("join_timeout")
        next_state = 0.0
        while len(got) < job_gen.nnodes:
            for rank in sorted(set(range(job_gen.nnodes)) - set(got)):
                key = f"outcome/{rank}"
                if joined.store.check([key]):
                    got[rank] = _outcome(rank, joined.store.get(key))
            now = time.monotonic()
            if len(got) < job_gen.nnodes and now >= next_state:
                next_state = now + STATE_EVERY
                snap = self._rdzv_or_fail().snapshot()
                gone = set(range(job_gen.nnodes)) if now > deadline else set()
                if snap is not None:
                    gone |= lost(joined.members, snap.participants, snap.heartbeats, time.time(),
                                 self.cfg.keep_alive_bound)  # fmt: skip
                for rank in gone - set(got):
                    got[rank] = NodeOutcome(rank, Action.RESCHEDULE, Reason.NODE_LOST,
                                            "its daemon stopped keeping the rendezvous alive")  # fmt: skip
            if len(got) < job_gen.nnodes and stop.wait(self.cfg.poll_interval):
                raise _Stopped
        return [got[r] for r in sorted(got)]

    async def publish(self, job_gen: JobGeneration, own: NodeOutcome) -> None:
        """Publish this node's outcome without waiting for the others' (a node that stops)."""
        joined = _joined(job_gen)
        await in_thread(self._guard(lambda: _put_outcome(joined, own)), "rdzv-publish")

    async def finish(
        self, job_gen: JobGeneration | None, action: Action, *, job_over: bool, live: int = 1
    ) -> None:
        """Leave the job: close it (``job_over``: abort or done; ``live`` nodes
        wait for each other, one of them hosts the store) or step out of the round."""
        rdzv = self._rdzv
        if rdzv is None:
            return
        self.note("left", outcome=str(action))

        def finish() -> None:
            if not job_over:
                rdzv.leave()
                return
            why = {"action": str(action), "host": self._status["host"]}
            rdzv.base.set("closed", orjson.dumps(why).decode())
            rdzv.close()
            snap = rdzv.snapshot()
            if snap is not None and (snap.spares or snap.waiting):
                # they look at the state once a second; let them see it closed
                # before the store (hosted by one of us) goes away
                time.sleep(SPARES_NOTICE)
            if job_gen is not None and job_gen.joined is not None:
                _barrier(job_gen.joined, live, EXIT_BARRIER)

        try:
            await in_thread(finish, "rdzv-finish")
        except Exception as exc:
            self._events.emit("rendezvous_leave_failed", logging.WARNING, error=str(exc))

    # -- the job's node table, for ft-supervisor status ---------------------------------------

    def share(self, **fields: Any) -> None:
        """Add to this node's published status (straggler medians): the watcher publishes
        it, off the loop, at its next look at the rendezvous (about a second)."""
        with self._lock:
            self._status = {**self._status, **fields}
            self._unpublished = True

    def note(self, state: str, **fields: Any) -> None:
        """Record this node's state; published with the next store access."""
        with self._lock:
            self._status = {**self._status, "state": state, **fields, "updated": round(time.time(), 3)}
        if self._slot is not None:
            self._publish()

    def _register(self) -> None:
        if self._slot is None:
            self._slot = int(self._rdzv_or_fail().base.add("nodes", 1)) - 1
        self._publish()

    def _publish(self) -> None:
        try:
            with self._lock:
                status = dict(self._status)
            self._rdzv_or_fail().base.set(f"node/{self._slot}", orjson.dumps(status).decode())
        except Exception:  # noqa: S110 - status only; the next note retries
            pass

    def _refresh_nodes(self) -> None:
        base = self._rdzv_or_fail().base
        count = int(base.add("nodes", 0))
        keys = [f"node/{i}" for i in range(count)]
        nodes = [orjson.loads(base.get(k)) for k in keys if base.check([k])]
        with self._lock:
            self._nodes = nodes

    def nodes(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._nodes)


class _Stopped(Exception):
    """The awaiting side gave up; the thread ends quietly."""


def _joined(job_gen: JobGeneration) -> Joined:
    if job_gen.joined is None:
        raise RuntimeError(f"generation {job_gen.generation} has no rendezvous round")
    return job_gen.joined


def _text(store: Any, key: str, default: str) -> str:
    try:
        raw = store.get(key)
    except Exception:
        return default
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def _put_outcome(joined: Joined, own: NodeOutcome) -> None:
    joined.store.set(f"outcome/{own.node_rank}", orjson.dumps(own.to_json()).decode())


def _outcome(rank: int, raw: bytes) -> NodeOutcome:
    try:
        outcome = NodeOutcome.from_json(orjson.loads(raw))
    except (ValueError, TypeError) as exc:
        # a peer we cannot understand is a peer we cannot follow
        return NodeOutcome(rank, Action.RESCHEDULE, Reason.NODE_LOST, f"unreadable outcome: {exc}")
    return outcome


def _news(snap: Snapshot, joined: Joined, bound: float) -> tuple[PeerNews, str] | None:
    if snap.closed:
        return PeerNews.CLOSED, "the rendezvous was closed"
    if snap.waiting:
        return PeerNews.WAITING, f"{len(snap.waiting)} node(s) waiting to join"
    others = {r: who for r, who in joined.members.items() if who != joined.me}
    gone = lost(others, snap.participants, snap.heartbeats, time.time(), bound)
    if gone:
        return (
            PeerNews.LOST,
            f"node(s) {sorted(gone)} stopped keeping the rendezvous alive (bound {bound:g} s)",
        )
    return None


def _barrier(joined: Joined, n: int, timeout: float) -> None:
    """Wait (bounded) for every node to be done with the store: one of us hosts it."""
    joined.store.add("left", 1)
    deadline = time.monotonic() + timeout
    while joined.store.add("left", 0) < n and time.monotonic() < deadline:
        time.sleep(0.05)
