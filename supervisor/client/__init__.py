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

import contextlib
import faulthandler
import os
import signal
import threading
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from supervisor.client.channel import Channel
from supervisor.core.topology import ENV_RANKS_ENDPOINT as ENV_ENDPOINT
from supervisor.core.topology import ENV_TIMEOUTS
from supervisor.transport.schema import Request, encode

__all__ = [
    "Request",
    "end_all_sections",
    "end_section",
    "heartbeat",
    "init",
    "is_active",
    "load_state_dict",
    "report_checkpoint",
    "report_iteration",
    "request",
    "section",
    "shutdown",
    "start_section",
    "state_dict",
]

# A real-time signal: applications rarely use them, so the stack dump handler
# (faulthandler, async-signal-safe, works with the GIL held elsewhere) does not
# collide with their SIGUSR1/SIGUSR2 handlers.
STACK_SIGNAL = signal.SIGRTMIN + 4
# an explicit shutdown may wait this long for its last messages (the bye) to leave
SHUTDOWN_LINGER_MS = 500


class _Client:
    def __init__(self, endpoint: str, environ: Mapping[str, str]) -> None:
        self.rank = int(environ.get("RANK", "0"))
        self.gen = int(environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.channel = Channel(endpoint)
        self.timeouts: dict[str, Any] = _parse_timeouts(environ.get(ENV_TIMEOUTS))
        self.monitored = frozenset(self.timeouts.get("sections") or ())
        self.iteration: int | None = None
        self._heartbeat = encode("heartbeat", rank=self.rank, gen=self.gen)
        stacks = self._install_stack_dump()
        self.send("hello", pid=os.getpid(), stack_signal=stacks)

    def _install_stack_dump(self) -> int | None:
        if threading.current_thread() is not threading.main_thread():
            return None  # signal handlers can only be set from the main thread
        try:
            # fd 2: the rank's stderr log, whatever sys.stderr becomes later
            faulthandler.register(STACK_SIGNAL, file=2, all_threads=True, chain=False)
        except (RuntimeError, ValueError, AttributeError, OSError):
            return None
        return int(STACK_SIGNAL)

    def send(self, kind: str, **fields: Any) -> None:
        self.channel.send(encode(kind, rank=self.rank, gen=self.gen, **fields))

    def heartbeat(self) -> None:
        self.channel.send(self._heartbeat)


def _parse_timeouts(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


class _Holder:
    """The process's client, once ``init`` made one; ``inactive`` once it found no daemon."""

    client: _Client | None = None
    inactive = False
    lock = threading.Lock()


_held = _Holder()


def init(*, warn: bool = True) -> bool:
    """Connect to the daemon. True when one supervises this rank; idempotent."""
    with _held.lock:
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
    return _held.client is not None or init(warn=False)


def _get() -> _Client | None:
    if _held.client is None:
        init()
    return _held.client


def heartbeat() -> None:
    """This rank is alive. About a microsecond; never blocks."""
    c = _held.client or _get()
    if c is not None:
        c.heartbeat()


def start_section(name: str) -> None:
    c = _held.client or _get()
    if c is not None and name in c.monitored:
        c.send("section", op="open", name=name, iteration=c.iteration)


def end_section(name: str) -> None:
    c = _held.client or _get()
    if c is not None and name in c.monitored:
        c.send("section", op="close", name=name, iteration=c.iteration)


def end_all_sections() -> None:
    c = _held.client or _get()
    if c is not None:
        c.send("section", op="close_all", name=None, iteration=c.iteration)


@contextlib.contextmanager
def section(name: str) -> Iterator[None]:
    """``with section("step"):`` - open on entry, closed however the block ends."""
    start_section(name)
    try:
        yield
    finally:
        end_section(name)


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


def request(action: Request | str, reason: str = "") -> None:
    """Ask the daemon for an outcome: continue, exclude_node, shutdown, reschedule, abort."""
    action = Request(action)
    c = _held.client or _get()
    if c is not None:
        c.send("request", action=str(action), reason=str(reason)[:4096])


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


def shutdown() -> None:
    """Stop monitoring this rank (it is about to exit on purpose)."""
    c = _held.client
    if c is not None:
        c.send("bye")
        c.channel.close(linger_ms=SHUTDOWN_LINGER_MS)
        _held.client = None
