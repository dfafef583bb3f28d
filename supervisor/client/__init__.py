"""Inside training: tell the ft-supervisor daemon that this rank is alive.

    from supervisor import client

    client.init()                        # optional: the first call does it
    for step in range(...):
        with client.section("step"):     # a monitored section, with a timeout
            train_step()
        client.heartbeat()               # or heartbeats, or both

Every call is fire and forget (about a microsecond): a missing, slow or
restarting daemon never blocks or crashes training. Without a daemon (the
script run by hand, or under plain torchrun) every call is a no-op, after one
warning. Sections the daemon does not monitor cost nothing at all.

Light on purpose: no asyncio, nothing of the daemon; pyzmq and orjson only.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

import orjson

from supervisor.client.channel import Channel
from supervisor.client.saver import SaveCallback, Saver, SaveRequest
from supervisor.client.timing import StepTimer, ddp_hook
from supervisor.core.learning import Learned
from supervisor.core.topology import ENV_KEY, ENV_TIMEOUTS
from supervisor.core.topology import ENV_RANKS_ENDPOINT as ENV_ENDPOINT
from supervisor.transport.schema import MAX_CAUSES, MAX_TRACEBACK, RequestAction, encode

__all__ = [
    "RequestAction",
    "SaveRequest",
    "SetupError",
    "advised_checkpoint_interval",
    "calculate_timeouts",
    "checkpoint_interval_advice",
    "end_all_sections",
    "end_section",
    "heartbeat",
    "init",
    "is_active",
    "load_state_dict",
    "nvrx_served",
    "on_save",
    "report_checkpoint",
    "report_iteration",
    "request",
    "section",
    "shutdown",
    "start_section",
    "state_dict",
    "waiting",
    "watch_ddp",
]

# A real-time signal: applications rarely use them, so the stack dump handler
# (faulthandler, async-signal-safe, works with the GIL held elsewhere) does not
# collide with their SIGUSR1/SIGUSR2 handlers.
STACK_SIGNAL = signal.SIGRTMIN + 4
# at an explicit shutdown or at exit, wait this long at most for the last
# messages to leave (with a live daemon they leave at once)
SHUTDOWN_LINGER_MS = 500
REQUEST_ACK_TIMEOUT = 2.0
ADVICE_TIMEOUT = 0.5  # an idle daemon answers in well under a millisecond


class SetupError(ValueError):
    """An integration (``supervisor.client.lightning``...) was given what cannot work; the
    message says what to change. The daemon aborts the job at once (rule P0-SETUP): a
    restart would fail the same way."""


class _Client:
    def __init__(self, endpoint: str, environ: Mapping[str, str]) -> None:
        self.rank = int(environ.get("RANK", "0"))
        self.gen = int(environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        # this rank's key: the daemon accepts messages only with it
        self.key = environ.get(ENV_KEY, "")
        self.channel = Channel(endpoint)
        self.timeouts: dict[str, Any] = _parse_timeouts(environ.get(ENV_TIMEOUTS))
        self.monitored = frozenset(self.timeouts.get("sections") or ())
        self.iteration: int | None = None
        self.endpoint = endpoint
        self.saver: Saver | None = None
        self.timer: StepTimer | None = None  # own work vs waiting per step, once asked for
        self._heartbeat = encode("heartbeat", rank=self.rank, gen=self.gen, k=self.key)
        stacks = self._install_stack_dump()
        self.send("hello", pid=os.getpid(), stack_signal=stacks)
        self._install_excepthook()
        # a rank's last words (a request, an error report) often come right before
        # it exits: give them a bounded moment to leave
        atexit.register(self.channel.close, SHUTDOWN_LINGER_MS)

    def _install_stack_dump(self) -> int | None:
        if threading.current_thread() is not threading.main_thread():
            return None  # signal handlers can only be set from the main thread
        try:
            # faulthandler puts back the handler it found when the interpreter finalizes:
            # ignored, so that a late dump request cannot kill an exiting rank (a
            # real-time signal's default action) and lose its own exit status
            signal.signal(STACK_SIGNAL, signal.SIG_IGN)
            # fd 2: the rank's stderr log, whatever sys.stderr becomes later
            faulthandler.register(STACK_SIGNAL, file=2, all_threads=True, chain=False)
        except (RuntimeError, ValueError, AttributeError, OSError):
            return None
        return int(STACK_SIGNAL)

    def _install_excepthook(self) -> None:
        # the daemon learns what killed the rank from the rank itself: the type's
        # qualified name and the chain of causes, which a log tail may have cut
        previous = sys.excepthook

        def report_then_print(
            kind: type[BaseException], value: BaseException, tb: TracebackType | None
        ) -> None:
            with contextlib.suppress(Exception):
                self.report_exception(value)
            previous(kind, value, tb)

        sys.excepthook = report_then_print

    def report_exception(self, exc: BaseException) -> None:
        causes: list[list[str]] = []
        seen = {id(exc)}
        cause = exc.__cause__ or exc.__context__
        while cause is not None and id(cause) not in seen and len(causes) < MAX_CAUSES:
            seen.add(id(cause))
            causes.append([_qualified(type(cause)), str(cause)[:4096]])
            cause = cause.__cause__ or cause.__context__
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.send(
            "exception",
            exc_type=_qualified(type(exc)),
            message=str(exc)[:4096],
            traceback=text[-MAX_TRACEBACK:],
            causes=causes,
            pid=os.getpid(),
        )

    def send(self, kind: str, **fields: Any) -> None:
        self.channel.send(encode(kind, rank=self.rank, gen=self.gen, k=self.key, **fields))

    def heartbeat(self) -> None:
        self.channel.send(self._heartbeat)

    def step_timer(self) -> StepTimer:
        if self.timer is None:
            self.timer = StepTimer(self._timing)
        return self.timer

    def _timing(self, work: float, wait: float) -> None:
        self.send("timing", work=round(work, 6), wait=round(wait, 6))


def _qualified(kind: type[BaseException]) -> str:
    module = kind.__module__
    return kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"


def _parse_timeouts(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


class _Holder:
    """The process's client, once ``init`` made one; ``inactive`` once it found no
    daemon; ``shut`` after ``shutdown()`` (calls are no-ops until ``init()`` again)."""

    client: _Client | None = None
    inactive = False
    shut = False
    lock = threading.Lock()


_held = _Holder()


def init(*, warn: bool = True) -> bool:
    """Connect to the daemon. True when one supervises this rank; idempotent."""
    with _held.lock:
        _held.shut = False
        if _held.client is not None:
            return True
        if _held.inactive:
            return False
        endpoint = os.environ.get(ENV_ENDPOINT)
        if not endpoint:
            _held.inactive = True
            if warn:
                warnings.warn(
                    "supervisor.client: no ft-supervisor daemon supervises this process "
                    f"({ENV_ENDPOINT} is not set); heartbeats and sections are no-ops",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return False
        _held.client = _Client(endpoint, os.environ)
        return True


def is_active() -> bool:
    """True when a daemon supervises this rank (connecting if need be, unless shut down)."""
    return _held.client is not None or (not _held.shut and init(warn=False))


def _get() -> _Client | None:
    if _held.client is None and not _held.shut:
        init()
    return _held.client


def heartbeat() -> None:
    """This rank is alive. About a microsecond; never blocks."""
    c = _held.client or _get()
    if c is not None:
        c.heartbeat()


def start_section(name: str) -> None:
    c = _held.client or _get()
    if c is None:
        return
    if c.timer is not None and name != "step":
        c.timer.tainted = True  # evaluation, checkpointing: this step is no measure of speed
    if name in c.monitored:
        c.send("section", op="open", name=name, iteration=c.iteration)


def end_section(name: str, *, failed: bool = False) -> None:
    """``failed``: an exception ended the section, so its length is no measure of the work
    (the daemon does not learn timeouts from it)."""
    c = _held.client or _get()
    if c is not None and c.timer is not None and name == "step" and not failed:
        c.timer.step_end()
    if c is not None and name in c.monitored:
        if failed:
            c.send("section", op="close", name=name, iteration=c.iteration, failed=True)
        else:
            c.send("section", op="close", name=name, iteration=c.iteration)


def end_all_sections(*, failed: bool = False) -> None:
    c = _held.client or _get()
    if c is not None:
        if failed:
            c.send("section", op="close_all", name=None, iteration=c.iteration, failed=True)
        else:
            c.send("section", op="close_all", name=None, iteration=c.iteration)


@contextlib.contextmanager
def section(name: str) -> Iterator[None]:
    """``with section("step"):`` - open on entry, closed however the block ends (an
    exception closes it as failed)."""
    start_section(name)
    try:
        yield
    except BaseException:
        end_section(name, failed=True)
        raise
    end_section(name)


def watch_ddp(model: Any, *, hook: Any = None, state: Any = None) -> bool:
    """Time each step's own work and its wait in the gradient all-reduce, for straggler
    detection: registers a DDP communication hook on ``model`` (a
    ``DistributedDataParallel``) around ``hook`` (default: DDP's own all-reduce, so the
    gradients are unchanged) with its ``state`` (for the default hook: the process
    group, None for the default one). Call it once, instead of
    ``model.register_comm_hook(state, hook)``. True when a daemon supervises this rank
    (without one, nothing is registered: register your hook yourself)."""
    c = _held.client or _get()
    if c is None:
        return False
    model.register_comm_hook(state, ddp_hook(c.step_timer(), hook))
    return True


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """``with waiting(): dist.all_reduce(t)``: time spent waiting in a collective, not
    working (for straggler detection, with collectives DDP's hook does not see). The
    step's end is the ``step`` section closing, unless ``watch_ddp`` marks it."""
    c = _held.client or _get()
    if c is None:
        yield
        return
    timer = c.step_timer()
    began = time.perf_counter()
    try:
        yield
    finally:
        timer.waited(time.perf_counter() - began)


def report_iteration(iteration: int) -> None:
    c = _held.client or _get()
    if c is not None:
        c.iteration = int(iteration)
        c.send("iteration", iteration=c.iteration)


def report_checkpoint(event: str) -> None:
    """``loaded`` or ``saved``: what allows the setup / checkpointing timeouts to be learned."""
    if event not in ("loaded", "saved"):
        raise ValueError("event must be 'loaded' or 'saved'")
    c = _held.client or _get()
    if c is not None:
        c.send("checkpoint", event=event)


def request(action: RequestAction | str, reason: str = "", *, timeout: float = REQUEST_ACK_TIMEOUT) -> bool:
    """Ask the daemon for an outcome: continue, exclude_node, shutdown, reschedule, abort.

    Unlike the other calls this one waits (``timeout`` s at most) for the daemon to
    acknowledge it, since a rank usually asks right before it exits. True once
    acknowledged.
    """
    action = RequestAction(action)
    c = _held.client or _get()
    if c is None:
        return False
    request_id = uuid.uuid4().hex[:16]
    c.send("request", action=str(action), reason=str(reason)[:4096], id=request_id)
    return c.channel.await_ack(request_id, timeout)


def calculate_timeouts(
    *,
    heartbeat: bool = False,
    sections: list[str] | None = None,
    all_sections: bool = False,
    out_of_section: bool = False,
    timeout: float = REQUEST_ACK_TIMEOUT,
) -> bool | None:
    """Have the daemon calculate timeouts now, from what every rank of the node showed so
    far, and put them in force at once (nvidia-resiliency-ext's ``calculate_and_set_*``).

    ``sections`` names the sections (``all_sections``: every monitored one). Waits
    (``timeout`` s at most) for the answer: True when calculated, False when not enough
    was seen yet, None when no daemon answered. ``state_dict()`` has the new values.
    """
    c = _held.client or _get()
    if c is None:
        return None
    request_id = uuid.uuid4().hex[:16]
    c.send("calculate", id=request_id, heartbeat=heartbeat, sections=sections,
           sections_too=all_sections or sections is not None, out_of_section=out_of_section)  # fmt: skip
    reply = c.channel.await_reply(request_id, timeout)
    if reply is None:
        return None
    timeouts = reply.get("timeouts")
    if isinstance(timeouts, dict):
        c.timeouts = timeouts
    return reply.get("ready") is True


def advised_checkpoint_interval(*, timeout: float = ADVICE_TIMEOUT) -> float | None:
    """The checkpoint interval the daemon advises, in seconds from one save's start to the
    next's: ``Ts + sqrt(2 (Tf + Tr) Ts + Ts^2)`` on what it measured of this run (the
    saves' time, the mean time to failure, the recoveries' time).

    None when no daemon supervises this rank, none answered within ``timeout`` seconds,
    or it cannot advise yet: no ``checkpointing`` section completed (the section must be
    monitored: ``--ft-rank-section-timeouts checkpointing:none``), or no failure seen
    and no ``--mtbf`` prior. A round trip to the daemon: ask after a save, not every step.
    Ranks that save together must agree on when: let one ask and broadcast the answer.
    """
    advice = checkpoint_interval_advice(timeout=timeout)
    seconds = None if advice is None else advice.get("seconds")
    return float(seconds) if isinstance(seconds, int | float) and not isinstance(seconds, bool) else None


def checkpoint_interval_advice(*, timeout: float = ADVICE_TIMEOUT) -> dict[str, Any] | None:
    """The daemon's whole advice (``seconds`` and what it was computed from: ``ts``,
    ``tf``, ``tr``, the counts, ``why`` when there is none); None when no daemon answered
    within ``timeout`` seconds."""
    c = _held.client or _get()
    if c is None:
        return None
    request_id = uuid.uuid4().hex[:16]
    c.send("checkpoint_interval", id=request_id)
    reply = c.channel.await_reply(request_id, timeout)
    if reply is None:
        return None
    return {k: v for k, v in reply.items() if k not in ("v", "type", "id")}


def on_save(callback: SaveCallback | None) -> bool:
    """Register the dying-gasp save: ``callback(request)`` runs when the daemon is about to
    stop this rank (a failure elsewhere, a hang, a restart, the scheduler's SIGTERM).

    It runs in a thread of its own, since the training loop may be blocked in a
    collective with a dead peer: save state the loop keeps consistent (the last
    completed step's), and do not start collectives. ``request.deadline`` is the
    time it has; after that the rank is stopped anyway. ``None`` unregisters.
    True when a daemon supervises this rank.
    """
    c = _held.client or _get()
    if c is None:
        return False
    if c.saver is not None and c.saver.pid == os.getpid():
        c.saver.callback = callback
    elif callback is not None:
        c.saver = Saver(c.endpoint, c.rank, c.gen, c.key, callback)
    return True


def state_dict() -> dict[str, Any]:
    """The timeouts in force for this rank, learned ones marked: save it with a checkpoint."""
    c = _held.client or _get()
    timeouts = dict(c.timeouts) if c is not None else {}
    return {"ft_supervisor_timeouts": timeouts}


def load_state_dict(state: Mapping[str, Any]) -> None:
    """Hand timeouts saved by ``state_dict`` back to the daemon; they count as learned."""
    c = _held.client or _get()
    timeouts = state.get("ft_supervisor_timeouts") if isinstance(state, Mapping) else None
    if c is None or not isinstance(timeouts, Mapping):
        return
    learned = timeouts.get("learned")
    if isinstance(learned, Mapping):
        c.send("timeouts", timeouts=dict(learned))
        # as the daemon merges it: what it learned itself wins, the loaded state fills gaps
        mine = Learned.from_json(c.timeouts.get("learned"))
        c.timeouts["learned"] = mine.filled_from(Learned.from_json(dict(learned))).to_json()


def nvrx_served(version: str | None) -> None:
    """Tell the daemon this rank's ``nvidia_resiliency_ext.fault_tolerance`` is ours."""
    c = _held.client or _get()
    if c is not None:
        c.send("nvrx", version=None if version is None else str(version)[:64])


def shutdown() -> None:
    """Stop monitoring this rank (it is about to exit on purpose)."""
    with _held.lock:
        c, _held.client, _held.shut = _held.client, None, True
    if c is not None:
        c.send("bye")
        c.channel.close(linger_ms=SHUTDOWN_LINGER_MS)
