"""The daemon's eyes inside the ranks: what they say, their deadlines, their hangs.

One ``RankWatch`` per rank of the current generation, fed by the ranks' messages
(``inbox``), and one timer per rank at its next deadline (``timers``): a rank
whose deadline passes is hung, unless what it sent meanwhile moved the deadline.
"""

from __future__ import annotations

import asyncio
import traceback
from collections import Counter
from collections.abc import Callable, Collection, Sequence

import zmq.asyncio

from supervisor.clock import Clock
from supervisor.core.catalogue.checkpoints import CheckpointReported
from supervisor.core.catalogue.ranks import (
    ChildException,
    ExceptionReported,
    MessageFailed,
    RankConnected,
    RankStepping,
    TimeoutsCalculated,
    TimeoutsRestored,
    WorkloadRequest,
)
from supervisor.core.learning import CHECKPOINTING, Calculation, Learned, calculate, observe
from supervisor.core.types import ReportedException
from supervisor.core.watch import STEP, Hang, RankWatch, Timeouts
from supervisor.runtime.lifecycle.inbox import Inbox
from supervisor.runtime.lifecycle.notices import Notices
from supervisor.runtime.lifecycle.snapshot_requests import SnapshotRequests
from supervisor.runtime.lifecycle.timers import Timers
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.services.loopwatch import LoopWatch
from supervisor.transport import schema
from supervisor.transport.schema import Dropped, DropReason

STALLED = 0.5  # a timer this late means the loop itself was stalled (see loopwatch)


class Monitor:
    def __init__(
        self,
        sock: zmq.asyncio.Socket,
        *,
        ranks: Collection[int],
        configured: Timeouts,
        learned: Learned,
        clock: Clock,
        events: EventLog,
        on_hang: Callable[[Hang], None],
        secret: bytes = b"",
        loop_watch: LoopWatch | None = None,
        persist: Callable[[Learned], None] = lambda learned: None,
        safety_factor: float = 5.0,
        on_work: Callable[[int, float, bool], None] = lambda rank, seconds, measured: None,
    ) -> None:
        self.inbox = Inbox(sock, secret=secret, clock=clock, events=events, deliver=self._receive)
        self._ranks = frozenset(ranks)
        self.inbox.expect(None, self._ranks)
        self.configured = configured
        self.learned = learned
        self.timeouts = learned.over(configured)
        self._clock = clock
        self._events = events
        self._on_hang = on_hang
        self._loop = loop_watch  # when the daemon itself was stalled: not the ranks' time
        self._persist = persist
        self._safety_factor = safety_factor
        self._on_work = on_work  # a step's own work, for straggler detection (measured: by the client)
        self._base = learned  # in force when the generation started: what a calculation merges with
        self.generation: int | None = None
        self.watches: dict[int, RankWatch] = {}
        self.stack_signals: dict[int, int] = {}  # rank -> signal its client dumps stacks on
        self.pids: dict[int, int] = {}
        self.requests: list[schema.WorkloadRequest] = []
        self.exceptions: dict[int, ReportedException] = {}
        self.exception_at: dict[int, float] = {}  # rank -> when (monotonic) its report came
        self.savers: dict[int, bytes] = {}  # rank -> its saver socket (a save callback waits there)
        self.saves: dict[str, schema.Saved] = {}  # answers to "save now", by request id
        self.save_news = asyncio.Event()
        self._timers = Timers(clock, self._fire)
        self._hung: set[int] = set()
        self._stepping_ranks: set[int] = set()
        self.stepping = asyncio.Event()  # every rank of the generation completed a step
        self._notices = Notices(events)
        self._handler_errors: set[str] = set()  # message kinds whose handling raised (told once)
        # the checkpoint interval advice (runtime.services.checkpoint_interval): a save's time
        # goes to it, and a rank's question is answered from it
        self.on_save: Callable[[int, float], None] = lambda rank, seconds: None
        self.advice: Callable[[], dict[str, object]] = lambda: {"seconds": None}
        # the snapshots the daemon holds (runtime.services.held_snapshots): its handler answers
        self.snapshots = SnapshotRequests(self.inbox, failed=self._failed)

    # -- generations ----------------------------------------------------------------

    def start_generation(self, number: int, pids: dict[int, int]) -> None:
        self._timers.cancel_all()
        self.generation = number
        self._ranks = frozenset(pids)  # a node's ranks change when nodes join or leave
        self.watches = {}
        self.stack_signals = {}
        self.pids = dict(pids)
        self.requests = []
        self.exceptions = {}
        self.exception_at = {}
        self.savers = {}
        self.saves = {}
        self._hung = set()
        self._stepping_ranks = set()
        self.stepping = asyncio.Event()
        self._base = self.learned
        self.inbox.expect(number, self._ranks)

    @property
    def stalls(self) -> Sequence[tuple[float, float]]:
        return () if self._loop is None else self._loop.stalls

    def rank_gone(self, generation: int, rank: int) -> None:
        """The rank's process exited: it can miss no deadline (a clean exit outside any
        section must not look like a hang a moment later)."""
        watch = self.watches.get(rank)
        if generation == self.generation and watch is not None:
            watch.closed = True
            self._timers.cancel(rank)

    def end_generation(self) -> list[RankWatch]:
        """Stop watching; what was observed, for learning."""
        self._timers.cancel_all()
        self.generation = None
        self.inbox.expect(None, self._ranks)
        return list(self.watches.values())

    def progressed(self, rank: int) -> bool | None:
        """Did the rank complete a step this generation? None: it never said (no client)."""
        watch = self.watches.get(rank)
        if watch is None:
            return None
        return watch.iteration is not None or watch.completed_steps > 0

    def iterations(self) -> list[int]:
        return [w.iteration for w in self.watches.values() if w.iteration is not None]

    def saved(self) -> bool:
        return any(w.checkpoint_saved for w in self.watches.values())

    def set_learned(self, learned: Learned) -> None:
        self.learned = learned
        self.timeouts = learned.over(self.configured)
        now = self._clock.monotonic()
        for rank in self.watches:
            self._timers.cancel(rank)
            self._arm(rank, now)

    # -- receiving ------------------------------------------------------------------

    async def run(self) -> None:
        """Read the ranks' messages until cancelled."""
        await self.inbox.run()

    @property
    def received(self) -> int:
        return self.inbox.received

    @property
    def drops(self) -> Counter[DropReason]:
        return self.inbox.drops

    def _receive(self, message: schema.RankMessage, now: float) -> None:
        try:
            self.handle(message, now)
        except Exception as exc:  # a bug here must not deafen the daemon
            # raised out of the reader callback, it would leave the edge-triggered socket
            # undrained: no message would ever be read again, no hang ever noticed
            self._failed(message, exc)

    def _failed(self, message: schema.RankMessage, exc: Exception) -> None:
        kind = type(message).__name__
        if kind not in self._handler_errors:
            self._handler_errors.add(kind)
            self._events.emit(
                MessageFailed(
                    message=kind,
                    rank=message.rank,
                    error=f"{type(exc).__name__}: {exc}",
                    traceback="".join(traceback.format_exception(exc))[-4000:],
                )
            )

    # -- what the ranks say -------------------------------------------------------------

    def handle(self, m: schema.RankMessage, now: float) -> None:
        watch = self.watches.get(m.rank)
        if watch is None:
            watch = self.watches[m.rank] = RankWatch(m.rank, started=now)
        watch.last_seen = now
        match m:
            case schema.Heartbeat():
                watch.heartbeat(now)
                self._notices.unmonitored(self.generation, m.rank, self.timeouts)
            case schema.Section():
                self._section(watch, m, now)
                self._stepping(watch)
            case schema.Iteration() | schema.Timing():
                self._progress(watch, m, now)
            case schema.Checkpoint(event=event):
                self._checkpoint(watch, event)
            case schema.Hello() | schema.NvrxServed():
                self._hello(m, watch)
            case schema.LoadTimeouts(timeouts=raw):
                self._load_timeouts(m.rank, raw)
            case (schema.Calculate() | schema.AdviceQuery() | schema.SnapshotBegin() | schema.SnapshotDone()
                  | schema.SnapshotRestore() | schema.Resumed()):  # fmt: skip
                self._answer(m)
            case schema.WorkloadRequest():
                self.requests.append(m)
                self.inbox.ack(m.id)
                self._events.emit(WorkloadRequest(generation=self.generation, rank=m.rank,
                                                  action=str(m.action), reason=m.reason))  # fmt: skip
            case schema.ExceptionReport():
                self._exception(m, now)
            case schema.Bye():
                watch.closed = True  # what it showed still counts for learning
            case schema.SaverReady() | schema.Saved():
                self._saving(m)
        self._arm(m.rank, now)

    def _section(self, watch: RankWatch, m: schema.Section, now: float) -> None:
        if m.op is schema.SectionOp.CLOSE_ALL:
            watch.close_all(now, self.timeouts, failed=m.failed)
        elif m.name is not None and m.op is schema.SectionOp.OPEN:
            # only what is monitored is kept: a client opens no other name, and a forged or
            # runaway stream of names must not grow a rank's table (or status with it)
            if self.timeouts.monitors(m.name):
                watch.open_section(m.name, now)
            else:
                self.inbox.drop(Dropped(DropReason.UNMONITORED_SECTION, m.name[:64]))
        elif m.name is not None:
            opened = watch.open_sections.get(m.name)
            # a step that overlapped another section (checkpointing...) says nothing of speed
            if m.name == STEP and opened is not None and not m.failed and len(watch.open_sections) == 1:
                self._on_work(m.rank, now - opened, False)
            if watch.close_section(m.name, now, self.timeouts, failed=m.failed) and opened is not None:
                self._saved(m, now - opened)
        if m.iteration is not None:
            watch.iteration = m.iteration

    def _saved(self, m: schema.Section, seconds: float) -> None:
        """A save completed (a healthy ``checkpointing`` section): what its time advises."""
        if m.name in CHECKPOINTING and not m.failed:
            self.on_save(m.rank, seconds)

    def _progress(self, watch: RankWatch, m: schema.Iteration | schema.Timing, now: float) -> None:
        if isinstance(m, schema.Timing):
            self._on_work(m.rank, m.work, True)  # a step's own work, measured inside the rank
            return
        watch.report_iteration(m.iteration, now)
        self._stepping(watch)

    def _exception(self, m: schema.ExceptionReport, now: float) -> None:
        if m.pid is not None and m.pid != self.pids.get(m.rank, m.pid):
            # a process the rank forked (a data-loader worker inherits the client) died of
            # its own exception: often of the rank's death, never the cause of it
            self._events.emit(ChildException(generation=self.generation, rank=m.rank, pid=m.pid,
                                             exc_type=m.exc_type, message=m.message[:300]))  # fmt: skip
            return
        self.exceptions[m.rank] = ReportedException(m.exc_type, m.message, m.traceback, m.causes)
        if m.rank not in self.exception_at:
            self.exception_at[m.rank] = now
            # when: what tells a rank that failed first from one we stopped (classify reads it too)
            self._events.emit(ExceptionReported(generation=self.generation, rank=m.rank,
                                                exc_type=m.exc_type, message=m.message[:300]))  # fmt: skip

    def _checkpoint(self, watch: RankWatch, event: str) -> None:
        if event == "loaded":
            watch.checkpoint_loaded = True
        else:
            watch.checkpoint_saved = True
        # what the run report measures recomputation from
        self._events.emit(CheckpointReported(generation=self.generation, rank=watch.rank,
                                             checkpoint=event, iteration=watch.iteration))  # fmt: skip

    def _stepping(self, watch: RankWatch) -> None:
        """Once per rank and generation: its first step, the end of a restart's downtime."""
        if watch.rank in self._stepping_ranks or not self.progressed(watch.rank):
            return
        self._stepping_ranks.add(watch.rank)
        if self._stepping_ranks >= self._ranks:
            self.stepping.set()
        self._events.emit(RankStepping(generation=self.generation, rank=watch.rank,
                                       iteration=watch.iteration))  # fmt: skip

    def _saving(self, m: schema.SaverReady | schema.Saved) -> None:
        if isinstance(m, schema.Saved):
            self.saves[m.id] = m
            self.save_news.set()
        # only the rank's own process: a forked child's callback does not hold the rank's state
        elif m.pid == self.pids.get(m.rank) and self.inbox.identity is not None:
            self.savers[m.rank] = self.inbox.identity
            self.inbox.ack(m.id)

    def ask_to_save(self, rank: int, request_id: str, reason: str, deadline: float) -> bool:
        """Send "save now" to the rank's saver; False when it has none or the send failed."""
        identity = self.savers.get(rank)
        if identity is None:
            return False
        request = schema.encode("save", id=request_id, reason=reason, deadline=deadline)
        return self.inbox.send(identity, request)

    def _answer(
        self, m: schema.Calculate | schema.AdviceQuery | schema.SnapshotBegin | schema.SnapshotDone
        | schema.SnapshotRestore | schema.Resumed,
    ) -> None:  # fmt: skip
        """A question the workload waits on: the answer comes back on its own socket."""
        if isinstance(m, schema.AdviceQuery):
            self.inbox.ack(m.id, **self.advice())
        elif isinstance(m, schema.Calculate):
            self._calculate(m)
        else:  # snapshots: begin, done, restore, where the rank resumed from
            self.snapshots.answer(m, self._ranks)

    def _calculate(self, m: schema.Calculate) -> None:
        """The workload's own calculation (nvidia-resiliency-ext's calculate_and_set_*):
        from what every rank of the node showed so far, in force at once."""
        ask = Calculation(m.heartbeat, m.sections, m.sections_too, m.out_of_section)
        obs = observe(self.watches.values())
        factor = self._safety_factor
        new = calculate(self._base, self.learned, obs, self.configured, ask, safety_factor=factor)
        if new is not None and new != self.learned:
            self.set_learned(new)
            self._persist(new)
            self._events.emit(
                TimeoutsCalculated(
                    generation=self.generation, rank=m.rank, learned=new.to_json(), in_force=self.in_force()
                )
            )
        self.inbox.ack(m.id, ready=new is not None, timeouts=self.learned.describe(self.configured))

    def in_force(self) -> dict[str, object]:
        t = self.timeouts
        return {"initial_heartbeat": t.initial_heartbeat, "heartbeat": t.heartbeat,
                "sections": dict(t.sections), "out_of_section": t.out_of_section}  # fmt: skip

    def _hello(self, m: schema.Hello | schema.NvrxServed, watch: RankWatch) -> None:
        """What a rank says of itself: its process, and which client it is."""
        if isinstance(m, schema.NvrxServed):
            self._notices.nvrx(self.generation, m)
            return
        # a rank's forked children may init the client too: only the rank's
        # own process may be signalled for its stacks
        if m.pid == self.pids.get(m.rank) and m.stack_signal is not None:
            self.stack_signals[m.rank] = m.stack_signal
        self._events.emit(RankConnected(generation=self.generation, rank=m.rank, pid=m.pid,
                                        stack_dumps=m.stack_signal is not None))  # fmt: skip

    def _load_timeouts(self, rank: int, raw: dict[str, object]) -> None:
        # what the daemon learned itself is fresher; the loaded state fills the gaps
        loaded = Learned.from_json(raw)
        merged = self.learned.filled_from(loaded)
        # what a calculation later in this generation merges with, as NVRx's EMA does
        self._base = self._base.filled_from(loaded)
        if merged == self.learned:
            return
        self._events.emit(TimeoutsRestored(rank=rank, timeouts=merged.to_json()))
        self.set_learned(merged)

    # -- deadlines ------------------------------------------------------------------

    def _arm(self, rank: int, now: float) -> None:
        if rank in self._hung:
            return
        deadline = self.watches[rank].deadline(self.timeouts, self.stalls)
        self._timers.arm(rank, None if deadline is None else deadline.at, now)

    def _fire(self, rank: int, armed_for: float | None) -> None:
        watch = self.watches.get(rank)
        if watch is None or self.generation is None:
            return
        now = self._clock.monotonic()
        if armed_for is not None and now - armed_for > STALLED and self._loop is not None:
            # the timer itself came this late: the loop did not run meanwhile (a stopped
            # or starved daemon), whether or not its own tick has said so yet
            self._loop.stalled(armed_for, now)
        # what the ranks sent while the loop was away is the newest news: read it first
        self.inbox.drain_now()
        hang = watch.expired(self.timeouts, now, self.stalls)
        if hang is None:
            self._arm(rank, now)  # early (a heartbeat moved it): wait for the new deadline
            return
        self._hung.add(rank)
        self._on_hang(hang)
