"""Inside training: tell the ft-supervisor daemon that this rank is alive.

    from supervisor import client

    client.init()                        # optional: the first call does it
    for step in range(...):
        with client.section("step"):     # a monitored section, with a timeout
            train_step()
        client.heartbeat()               # or heartbeats, or both
        client.snapshot(state, step)     # the state held in the daemon's memory (restore())

Every call is fire and forget (about a microsecond): a missing, slow or
restarting daemon never blocks or crashes training. Without a daemon (the
script run by hand, or under plain torchrun) every call is a no-op, after one
warning. Sections the daemon does not monitor cost nothing at all.

Light on purpose: no asyncio, nothing of the daemon; pyzmq and orjson only.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from supervisor.client.connection import SHUTDOWN_LINGER_MS as SHUTDOWN_LINGER_MS
from supervisor.client.connection import STACK_SIGNAL as STACK_SIGNAL
from supervisor.client.connection import current as _get
from supervisor.client.connection import held as _held
from supervisor.client.connection import init, is_active, shutdown
from supervisor.client.resuming import Resumed, resume
from supervisor.client.saver import SaveCallback, Saver, SaveRequest
from supervisor.client.snapshots import restore, snapshot
from supervisor.client.timing import ddp_hook
from supervisor.core.learning import Learned
from supervisor.transport.messages import RequestAction

__all__ = [
    "RequestAction",
    "Resumed",
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
    "restore",
    "resume",
    "section",
    "shutdown",
    "snapshot",
    "start_section",
    "state_dict",
    "waiting",
    "watch_ddp",
]

REQUEST_ACK_TIMEOUT = 2.0
ADVICE_TIMEOUT = 0.5  # an idle daemon answers in well under a millisecond


class SetupError(ValueError):
    """An integration (``supervisor.client.lightning``...) was given what cannot work; the
    message says what to change. The daemon aborts the job at once (rule P0-SETUP): a
    restart would fail the same way."""


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
