"""The one module that touches torch's private names: torch 2.13's dynamic rendezvous.

torch's ``DynamicRendezvousHandler`` has no public way to pace its looks at the
shared state (``pace.py``), to start its keep-alive at a phase of its own
(``keepalive.py``), to name who is in the round it just completed, or to step out
of a round without closing the job for everyone. This module does those things
with torch's handler, never to it: ``PacedHandler`` is a subclass of our own,
made for our own rendezvous names (``torchrdzv.register``), and nothing of
torch's, module, class or object, is assigned here. Each private name read or
overridden says why beside it.

The pace and the keep-alive phase reach furthest in, so they are only used on the
torch this was written against (``KNOWN``): on any other, ``build`` gives torch's
handler as it is (a look at the state a second, every keep-alive at once) and says
why, for the coordinator's ``rendezvous_fallback`` event. What the coordinator
cannot work without (the round's members, this node's identity, stepping out of a
round, the shared state's shape) is read on every version: the day torch changes
it, ``tests/component/test_rendezvous.py`` fails, not a job.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import Store  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import RendezvousInfo, RendezvousParameters
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousBackend,
    RendezvousSettings,
)

from supervisor.clock import SYSTEM, Clock
from supervisor.coord import keepalive
from supervisor.coord.pace import Pace, Window

KNOWN = "2.13"  # the torch whose private names PacedHandler relies on (torch.__version__'s prefix)


def version() -> str:
    return str(torch.__version__)


def unknown(running: str | None = None) -> str | None:
    """Why this torch gets torch's plain handler; None for the torch we know."""
    version = running or str(torch.__version__)
    if version.split("+")[0].split(".")[:2] == KNOWN.split("."):
        return None
    return (
        f"the quick rendezvous pace and the keep-alive phase are written against torch {KNOWN}'s "
        f"private rendezvous classes; torch {version} gets torch's own (the state looked at once "
        "a second while a round fills, every node's keep-alive at the same instant)"
    )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The shared rendezvous state at one moment (dynamic backends)."""

    round: int
    complete: bool
    closed: bool
    participants: dict[str, int]  # node identity -> node rank
    waiting: frozenset[str]  # want the next round
    spares: frozenset[str]  # torch's redundancy list: beyond MAX, waiting for a place
    heartbeats: dict[str, float]  # node identity -> wall-clock seconds


def snapshot(got: tuple[bytes, Any] | None) -> Snapshot:
    """The state as a backend's public ``get_state`` returns it: torch's pickled
    ``_RendezvousState``, whose fields are read here and nowhere else."""
    if got is None:
        return Snapshot(0, False, False, {}, frozenset(), frozenset(), {})
    state = pickle.loads(got[0])  # noqa: S301 - torch's own state, from torch's own store
    return Snapshot(
        round=state.round,
        complete=state.complete,
        closed=state.closed,
        participants={repr(n): r for n, r in state.participants.items()},
        waiting=frozenset(repr(n) for n in state.wait_list),
        spares=frozenset(repr(n) for n in state.redundancy_list),
        heartbeats={repr(n): t.timestamp() for n, t in state.last_heartbeats.items()},
    )


class NamedBackend(RendezvousBackend):
    """torch's backend under our name: torch's registry checks that the handler a
    creator returns says the name it was made for, and a handler says its backend's."""

    def __init__(self, inner: RendezvousBackend, name: str) -> None:
        self.inner, self._name = inner, name

    @property
    def name(self) -> str:
        return self._name

    def get_state(self) -> tuple[bytes, Any] | None:
        return self.inner.get_state()

    def set_state(self, state: bytes, token: Any | None = None) -> tuple[bytes, Any, bool] | None:
        return self.inner.set_state(state, token)


class Handler(DynamicRendezvousHandler):
    """torch's handler, made under one of our names, with what the coordinator reads of it."""

    fallback: str | None = None  # why this is torch's plain handler (build)
    state_backend: RendezvousBackend  # torch's, under its own name (build)
    state_store: Store  # the store torch's backend made, for our keys of the whole run

    _made: tuple[int, dict[str, int], str] | None = None  # the round's members (members())

    def members(self) -> tuple[int, dict[str, int], str]:
        """The round just completed: its number, who is in it (identity -> node rank),
        and this node's identity. torch's ``RendezvousInfo`` gives a rank and a world
        size only: who the others are is in the state that made the round, read from the
        handler's state holder (``_state_holder``) when torch starts the keep-alive, before
        any beat: a beat syncs that state and drops dead nodes from it in place (read
        after, at 1,024 simulated nodes a join failed with "dictionary changed size during
        iteration"). This node's identity is the handler's ``_this_node``, as the state names it."""
        if self._made is None:
            raise RuntimeError("members() before a round completed")
        return self._made

    def _start_heartbeats(self) -> None:
        self._note_round()
        super()._start_heartbeats()

    def _note_round(self) -> None:
        state = self._state_holder.state
        self._made = (state.round, {repr(n): r for n, r in state.participants.items()}, repr(self._this_node))

    def leave(self, deadline: float) -> None:
        """Step out of the round now, so the others need not wait for this node's
        keep-alive to go stale. torch does it only as the first step of its next
        ``next_rendezvous``, and ``shutdown`` closes the job for every node: so its
        keep-alive stops (``_stop_heartbeats``, as ``shutdown`` does) and its op
        executor (``_op_executor``) runs the exit op (``_RendezvousExitOp``)."""
        self._stop_heartbeats()
        self._op_executor.run(dyn._RendezvousExitOp(), deadline)


class PacedHandler(Handler):
    """torch's handler at our pace: quick, uncached looks at the state at the start
    of each round (``pace.Window``), and each node's keep-alive at its own phase."""

    def __init__(
        self,
        settings: RendezvousSettings,
        store: Store,
        backend: RendezvousBackend,
        *,
        pace: Pace,
        clock: Clock = SYSTEM,
        local_addr: str | None = None,
    ) -> None:
        self._window = Window(pace, settings.max_nodes, clock)
        self._beats: keepalive.Phased | None = None
        # torch's process-wide generator of node identities (a class attribute, read):
        # a node of ours never takes the identity of a handler torch makes in this process
        node = DynamicRendezvousHandler._node_desc_generator.generate(local_addr)
        # torch's holder of the shared state, made uncached (its constructor's
        # cache_duration); ours caches outside the window, as torch's would
        holder = _PacedHolder(
            dyn._BackendRendezvousStateHolder(backend, settings, cache_duration=0), self._window, pace.cache
        )
        super().__init__(node, settings, backend.name, store, holder)

    # torch's __init__ makes its op executor, and takes none: the one it makes is kept,
    # and the handler's own operations (join, exit, keep-alive) run it through ours
    @property
    def _op_executor(self) -> _PacedExecutor:
        return self._paced

    @_op_executor.setter
    def _op_executor(self, made: dyn._RendezvousOpExecutor) -> None:
        self._paced = _PacedExecutor(made, self._window)

    def next_rendezvous(self) -> RendezvousInfo:
        self._window.open()
        try:
            info = super().next_rendezvous()
        finally:
            self._window.close()
        # torch asked for the keep-alive (below) before it read the round from the state
        # (its world, its store): a first beat at a phase near 0 would sync and prune that
        # state under torch's reads. Our timer starts once torch is done with it.
        interval = self.settings.keep_alive_interval.total_seconds()
        self._beats = keepalive.Phased(self, _beat, interval, keepalive.phase(interval))
        self._beats.start()
        return info

    # torch's next_rendezvous asks for the keep-alive by this name when the round
    # completes, and stops it by the other (next round, shutdown): our timer in its
    # place, started when next_rendezvous returns
    def _start_heartbeats(self) -> None:
        self._note_round()

    def _stop_heartbeats(self) -> None:
        if self._beats is not None:
            self._beats.cancel()
            self._beats = None
        super()._stop_heartbeats()  # torch's own timer, had one started


def _beat(handler: DynamicRendezvousHandler) -> None:
    handler._keep_alive()  # torch's beat: its lock, its deadline, its logging


class _PacedHolder(dyn._RendezvousStateHolder):
    """torch's state holder (made uncached), cached as torch caches outside the window:
    within it every look reads the store."""

    def __init__(self, inner: dyn._RendezvousStateHolder, window: Window, cache: float) -> None:
        self._inner, self._window, self._cache = inner, window, cache
        self._dirty = False
        self._synced = float("-inf")

    @property
    def state(self) -> Any:
        return self._inner.state

    def sync(self) -> bool | None:
        now = self._window.clock.monotonic()
        if not self._dirty and not self._window.quick() and now - self._synced < self._cache:
            return None  # as torch's holder: nothing to write, and what it read is fresh enough
        has_set = self._inner.sync()
        self._dirty, self._synced = False, self._window.clock.monotonic()
        if has_set is False:  # another node wrote first: torch would write again at once
            self._window.back_off()
            self._inner.sync()  # and on what it read then, stale by now: read it again
            self._synced = self._window.clock.monotonic()
        elif has_set:
            self._window.won()
        return has_set

    def mark_dirty(self) -> None:
        self._dirty = True
        self._inner.mark_dirty()


class _PacedExecutor(dyn._RendezvousOpExecutor):
    """torch's op executor, looking again every ``Window.interval`` s instead of its
    second while the window lasts: an op that would wait for the others (torch's
    ``_Action.SYNC``) ends the executor's run instead, and the run starts again
    after the interval (reading the state anew: the holder is uncached then)."""

    def __init__(self, inner: dyn._RendezvousOpExecutor, window: Window) -> None:
        self._inner, self._window = inner, window

    def run(
        self,
        state_handler: Callable[[Any, float], Any],
        deadline: float,
        update_deadline: Callable[[timedelta], float] | None = None,
    ) -> None:
        self._window.begin(deadline)  # this op's losses, and how long it may back off
        renewed: Callable[[timedelta], float] | None = None
        if update_deadline is not None:

            def renewed(timeout: timedelta) -> float:  # a spare given a place: torch renews
                nonlocal deadline  # its deadline, which the next run must keep
                deadline = update_deadline(timeout)
                self._window.begin(deadline)
                return deadline

        while self._window.quick():
            op = _Held(state_handler)
            self._inner.run(op, deadline, renewed)
            if not op.waiting:
                return
            self._window.wait()
        self._inner.run(state_handler, deadline, renewed)


class _Held:
    """An op whose wait for the others (``_Action.SYNC``: torch would sleep a second
    and look again) ends the executor's run instead (``_Action.FINISH``)."""

    def __init__(self, op: Callable[[Any, float], Any]) -> None:
        self._op = op
        self.waiting = False

    def __call__(self, ctx: Any, deadline: float) -> Any:
        action = self._op(ctx, deadline)
        self.waiting = action == dyn._Action.SYNC
        return dyn._Action.FINISH if self.waiting else action


def build(
    store: Store, backend: RendezvousBackend, params: RendezvousParameters, pace: Pace, clock: Clock
) -> Handler:
    """The handler for ``params`` (its backend one of our names) over torch's ``backend``."""
    named = NamedBackend(backend, params.backend)
    # torch reads its own options (timeouts, keep-alive) from params: a handler it
    # makes (and that is never used) gives the settings, in public
    settings = dyn.create_handler(store, named, params).settings
    why = unknown()
    handler: Handler
    if why is None:
        handler = PacedHandler(settings, store, named, pace=pace, clock=clock, local_addr=params.local_addr)
    else:
        handler = Handler.from_backend(
            settings.run_id,
            store,
            named,
            settings.min_nodes,
            settings.max_nodes,
            params.local_addr,
            settings.timeout,
            keep_alive_interval=round(settings.keep_alive_interval.total_seconds()),
            keep_alive_max_attempt=settings.keep_alive_max_attempt,
        )
        handler.fallback = why
    handler.state_backend, handler.state_store = backend, store
    return handler
