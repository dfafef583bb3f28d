"""The job a node belongs to: alone (one node), or a rendezvous of daemons.

The daemon asks the same five things of either: ``join`` the next round (node
rank, world, master address), ``watch`` the peers while its ranks run,
``announce_end`` of its generation, ``agree`` on the round's outcomes, and
``finish`` (leave, or close the job). Everything a node publishes lives in the
rendezvous store under the round's prefix; torch's blocking calls run in
threads so the event loop never waits on the network. The job's node table
(``ft-supervisor status``, straggler medians) is ``nodetable.NodeTable``'s.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from supervisor.aio import in_thread
from supervisor.clock import SYSTEM, Clock
from supervisor.config.rendezvous import RdzvConfig
from supervisor.coord import incidents
from supervisor.coord import rounds as rnd
from supervisor.coord.local import JobGeneration, JobOver, LocalJob
from supervisor.coord.nodetable import NodeTable
from supervisor.core.catalogue.job import RendezvousFallback, RendezvousJoined, RendezvousLeaveFailed
from supervisor.core.jobwide import NodeOutcome, PeerNews, ask_others_every, look_every, lost, unpack
from supervisor.core.types import Action, EventSink, Reason
from supervisor.process.ports import free_port

__all__ = ["JobGeneration", "JobOver", "LocalJob", "RendezvousJob"]

if TYPE_CHECKING:
    from supervisor.coord.torchrdzv import Joined, TorchRendezvous

T = TypeVar("T")
# A node looks at the rendezvous state (who waits to join, whose keep-alive is stale)
# every STATE_EVERY s, less often in a large job: all nodes together about
# JOB_LOOKS times a second. The state grows with the job (about 150 bytes a node),
# and every look reads all of it. The first node to see news tells the others
# through the round's "ended" key, which they wait on: the store answers a
# ``wait`` when the key is set, so nodes at rest cost it nothing but their looks.
# A lost node shows only once its keep-alive is interval x attempts stale (15 s with
# torch's defaults), and a look after that finds it at once: 20 looks a second for the
# job notice it within 0.05 s on average. At 100, 1,024 simulated nodes' looks took
# most of this machine's two cores at rest (8 ms to read a 1,024-node state).
STATE_EVERY = 1.0
JOB_LOOKS = 20.0
# How often, at most, a node whose ranks still run asks whether every other node's
# ranks exited 0 (then a rank of its own still running --exit-grace later is stuck):
# the exit grace is seconds, and every question costs the store a request; in a large
# job each asks less often, all together about OTHERS_JOB times a second.
OTHERS_EVERY = 2.0
OTHERS_JOB = 20.0
GATHER_GRACE = 2.0  # seconds after every outcome is in before any node gathers them itself
SPARES_NOTICE = 2.5  # seconds nodes waiting in the rendezvous get to see it closed
EXIT_BARRIER = 5.0  # seconds the last nodes wait for each other before the store host leaves


class RendezvousJob:
    """One node of a multi-node job, through torch's elastic rendezvous."""

    multi = True

    def __init__(
        self,
        cfg: RdzvConfig,
        master_port: int | None,
        events: EventSink,
        clock: Clock = SYSTEM,
        *,
        nproc: int | None = None,
    ) -> None:
        self.cfg = cfg
        self._nproc = nproc  # the ranks this node runs; None: not checked against the others
        self._clock = clock
        self._master_port = master_port
        self._events = events
        self._rdzv: TorchRendezvous | None = None
        self._table = NodeTable(lambda: self._rdzv_or_fail().base, self._clock)
        self._others_done: set[int] = set()  # generations in which every other node succeeded

    # -- the rendezvous ----------------------------------------------------------------

    async def start(self) -> bool:
        """Import torch and reach the rendezvous store (raises JobOver)."""

        def connect() -> TorchRendezvous:
            from supervisor.coord.torchrdzv import RendezvousEnded, TorchRendezvous  # noqa: PLC0415

            try:
                return TorchRendezvous(self.cfg, self._clock)
            except RendezvousEnded as exc:
                raise JobOver(Action.RESCHEDULE, Reason.RENDEZVOUS_LOST, str(exc)) from None

        self._rdzv = await in_thread(connect, "rdzv-connect")
        if self._rdzv.fallback is not None:  # a torch this daemon does not know: torch's own pace
            self._events.emit(RendezvousFallback(torch=self._rdzv.torch, why=self._rdzv.fallback))
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
            self._same_layout(rdzv, joined)
            self._table.register()
            return joined, int(rdzv.base.add("restarts", 0))

        joined, used = await in_thread(self._guard(join), f"rdzv-join-{generation}")
        self._table.nnodes = joined.nnodes
        self._events.emit(
            RendezvousJoined(
                generation=generation,
                round=joined.round,
                node_rank=joined.node_rank,
                nnodes=joined.nnodes,
                master_addr=joined.master_addr,
                master_port=joined.master_port,
                restarts_used=used,
            )
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

    def _same_layout(self, rdzv: TorchRendezvous, joined: Joined) -> None:
        """Every node of a round runs as many ranks as the first: each numbers its ranks
        and sizes the world from its own count (torch's agents let nodes differ; we do
        not), so one that differs would give two ranks one number and a world that never
        fills. The first node to complete the round sets the count (one request a node);
        one that differs ends the job on every node with an abort (no node can fix it)."""
        if self._nproc is None:
            return
        first = joined.store.first("nproc", str(self._nproc))
        if first == str(self._nproc):
            return
        detail = (
            f"node {joined.node_rank} ({self._table.host}) runs {self._nproc} rank(s) and another node "
            f"of the job {first}: every node of a job must run the same number (--nproc-per-node)"
        )
        # the round hears it at once (the static backend has no state to see closed), and
        # its agreement has this node's word: every node's joint decision is the abort
        rnd.claim(joined, joined.nnodes, NodeOutcome(joined.node_rank, Action.ABORT, Reason.LAYOUT, detail))
        rnd.tell(joined, PeerNews.ENDED, detail)
        # the others stop their ranks and decide before they are done with the store
        self._close(
            rdzv, Action.ABORT, joined, joined.nnodes, max(EXIT_BARRIER, self.cfg.seconds("close_timeout"))
        )
        raise JobOver(Action.ABORT, Reason.LAYOUT, detail)

    def _close(
        self, rdzv: TorchRendezvous, action: Action, joined: Joined | None, live: int, wait: float
    ) -> None:
        """End the job for every node (blocking): why, for nodes that join later; the
        rendezvous closed, spares let go; then, as one of us may host the store, ``live``
        nodes wait for each other, ``wait`` s at most."""
        why = {"action": str(action), "host": self._table.host}
        rdzv.base.set("closed", orjson.dumps(why).decode())
        rdzv.close()
        snap = rdzv.snapshot()
        if snap is not None and (snap.spares or snap.waiting):
            # they look at the state once a second; let them see it closed
            # before the store (hosted by one of us) goes away
            self._clock.pause(SPARES_NOTICE)
        if joined is not None:
            rnd.barrier(joined, live, wait)

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
        wake = threading.Event()
        try:
            return await in_thread(
                self._guard(lambda: self._watch(job_gen, wake)), f"rdzv-watch-{job_gen.generation}"
            )
        finally:
            wake.set()

    def _watch(self, job_gen: JobGeneration, wake: threading.Event) -> tuple[PeerNews, str]:
        joined = _joined(job_gen)
        self._table.publish_shared()  # "running", noted on the loop: not a look later (N/20 s)
        heard = rnd.listen(joined, 0, "ended", wake, f"rdzv-listen-{job_gen.generation}")
        every = look_every(job_gen.nnodes, STATE_EVERY, JOB_LOOKS)
        others_every = ask_others_every(job_gen.nnodes, every, OTHERS_EVERY, OTHERS_JOB)
        delay = random.uniform(0, every)  # noqa: S311 - nodes spread their looks, nothing secret
        looks = 0
        while not wake.wait(delay):
            delay = every
            looks += 1
            if not joined.listeners.ready() and joined.store.check(["ended"]):
                return rnd.told(joined.store)  # its connection is still opening: look instead
            if (
                looks % others_every == 0
                and job_gen.generation not in self._others_done
                and rnd.others_succeeded(joined, job_gen.nnodes)
            ):
                self._others_done.add(job_gen.generation)
            self._table.publish_shared()
            snap = self._rdzv_or_fail().snapshot()
            if snap is None:
                continue
            news = rnd.news(snap, joined, self.cfg.keep_alive_bound, self._clock)
            if news is not None:
                rnd.tell(joined, *news)  # every other node hears it now, not at its next look
                return news
        if not heard:
            raise _Stopped
        if heard[0] is not None:
            raise heard[0]
        return rnd.told(joined.store)

    def others_done(self, generation: int) -> bool:
        """Whether every other node published that its ranks of ``generation`` all
        exited 0 (as learnt while watching; a node's own ranks may still run)."""
        return generation in self._others_done

    async def announce_end(self, job_gen: JobGeneration, why: str) -> None:
        """Tell the peers, first, that this node's generation is over."""
        joined = _joined(job_gen)
        detail = f"node {job_gen.node_rank} ({self._table.host}): {why}"
        await in_thread(self._guard(lambda: rnd.tell(joined, PeerNews.ENDED, detail)), "rdzv-announce")

    def board(self, job_gen: JobGeneration) -> incidents.Board:
        """The round's store, for a hang's incident (``coord.incidents``)."""
        return incidents.StoreBoard(_joined(job_gen).store, self._guard)

    # -- after the ranks ended -------------------------------------------------------------

    async def agree(self, job_gen: JobGeneration, own: NodeOutcome) -> list[NodeOutcome]:
        """Publish this node's outcome; return every node's (a lost node's as a reschedule)."""
        self.note("agreeing", outcome=str(own.action))
        wake = threading.Event()
        try:
            return await in_thread(
                self._guard(lambda: self._agree(job_gen, own, wake)), f"rdzv-agree-{job_gen.generation}"
            )
        finally:
            wake.set()

    def _agree(self, job_gen: JobGeneration, own: NodeOutcome, wake: threading.Event) -> list[NodeOutcome]:
        """Each node claims its own place once and publishes its outcome there; the
        node that fills the last place gathers them all and publishes the round's
        outcomes once (``decided``), which every node waits for. A node that sees
        another gone claims that one's place with a reschedule instead."""
        joined, n = _joined(job_gen), job_gen.nnodes
        self._table.publish_shared()  # "agreeing", noted on the loop
        heard = rnd.listen(joined, 1, "decided", wake, f"rdzv-decided-{job_gen.generation}")
        rnd.claim(joined, n, own)
        every = look_every(n, STATE_EVERY, JOB_LOOKS)
        deadline = self._clock.monotonic() + self.cfg.seconds("join_timeout")
        full_since: float | None = None
        delay = random.uniform(0, every)  # noqa: S311 - nodes spread their looks, nothing secret
        while not wake.wait(delay):
            delay = every
            now = self._clock.monotonic()
            if now > deadline:  # join_timeout without a decision: decide with what is there
                rnd.gather(joined, n)
                continue
            if joined.store.add("published", 0) >= n:
                # every place is filled, yet nothing is decided: the node that
                # filled the last one went away before gathering; anyone may
                full_since = now if full_since is None else full_since
                if now - full_since >= GATHER_GRACE:
                    rnd.gather(joined, n)
                continue
            snap = self._rdzv_or_fail().snapshot()
            if snap is None:
                continue
            bound = self.cfg.keep_alive_bound
            gone = lost(joined.members, snap.participants, snap.heartbeats, self._clock.wall(), bound)
            for rank in sorted(gone - {own.node_rank}):
                seen = f"its daemon stopped keeping the rendezvous alive (seen by node {own.node_rank})"
                rnd.claim(joined, n, NodeOutcome(rank, Action.RESCHEDULE, Reason.NODE_LOST, seen))
        if not heard:
            raise _Stopped
        if heard[0] is not None:
            raise heard[0]
        try:
            return unpack(orjson.loads(joined.store.get("decided")))
        except ValueError as exc:  # orjson's errors are ValueErrors too
            raise JobOver(
                Action.RESCHEDULE, Reason.RENDEZVOUS_LOST, f"the round's outcomes are unreadable: {exc}"
            ) from None

    async def publish(self, job_gen: JobGeneration, own: NodeOutcome) -> None:
        """Publish this node's outcome without waiting for the others' (a node that stops)."""
        joined = _joined(job_gen)
        await in_thread(self._guard(lambda: rnd.claim(joined, job_gen.nnodes, own)), "rdzv-publish")

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
            self._table.publish_shared()  # "left", noted on the loop
            if not job_over:
                rdzv.leave()
                return
            joined = job_gen.joined if job_gen is not None else None
            self._close(rdzv, action, joined, live, EXIT_BARRIER)

        try:
            await in_thread(finish, "rdzv-finish")
        except Exception as exc:
            self._events.emit(RendezvousLeaveFailed(error=str(exc)))

    # -- the job's node table (ft-supervisor status, straggler medians) --------------------

    def share(self, **fields: Any) -> None:
        self._table.share(**fields)

    def note(self, state: str, **fields: Any) -> None:
        self._table.note(state, **fields)

    def sample(self) -> list[dict[str, Any]]:
        return self._table.sample()

    def nodes(self) -> list[dict[str, Any]]:
        return self._table.nodes()


class _Stopped(Exception):
    """The awaiting side gave up; the thread ends quietly."""


def _joined(job_gen: JobGeneration) -> Joined:
    if job_gen.joined is None:
        raise RuntimeError(f"generation {job_gen.generation} has no rendezvous round")
    return job_gen.joined
