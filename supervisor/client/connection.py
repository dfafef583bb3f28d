"""The rank's one connection to the daemon: made by the first call (``init``), ended by
``shutdown``; what the calls of ``supervisor.client`` send goes through it.

``Client`` holds the rank's identity and key, its channel, the timeouts in force and
the helpers made on demand (the dying-gasp saver, the step timer); it installs the
stack dump handler and the excepthook that reports what killed the rank. ``held`` is
the process's client, or why there is none.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import orjson

from supervisor.client import flight
from supervisor.client.channel import Channel
from supervisor.client.saver import Saver
from supervisor.client.timing import StepTimer
from supervisor.core.topology import ENV_KEY, ENV_TIMEOUTS
from supervisor.core.topology import ENV_RANKS_ENDPOINT as ENV_ENDPOINT
from supervisor.transport.schema import MAX_CAUSES, MAX_TRACEBACK, encode

# A real-time signal: applications rarely use them, so the stack dump handler
# (faulthandler, async-signal-safe, works with the GIL held elsewhere) does not
# collide with their SIGUSR1/SIGUSR2 handlers.
STACK_SIGNAL = signal.SIGRTMIN + 4
# at an explicit shutdown or at exit, wait this long at most for the last
# messages to leave (with a live daemon they leave at once)
SHUTDOWN_LINGER_MS = 500


class Client:
    """This process's connection to the daemon, as one rank of one generation."""

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
        # asked beside the stacks: the Flight Recorder dump gloo's ranks cannot give otherwise
        flight.install(environ, self.rank)
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


class Holder:
    """The process's client, once ``init`` made one; ``inactive`` once it found no
    daemon; ``shut`` after ``shutdown()`` (calls are no-ops until ``init()`` again)."""

    client: Client | None = None
    inactive = False
    shut = False
    lock = threading.Lock()


held = Holder()


def init(*, warn: bool = True) -> bool:
    """Connect to the daemon. True when one supervises this rank; idempotent."""
    with held.lock:
        held.shut = False
        if held.client is not None:
            return True
        if held.inactive:
            return False
        endpoint = os.environ.get(ENV_ENDPOINT)
        if not endpoint:
            held.inactive = True
            if warn:
                warnings.warn(
                    "supervisor.client: no ft-supervisor daemon supervises this process "
                    f"({ENV_ENDPOINT} is not set); heartbeats and sections are no-ops",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return False
        held.client = Client(endpoint, os.environ)
        return True


def is_active() -> bool:
    """True when a daemon supervises this rank (connecting if need be, unless shut down)."""
    return held.client is not None or (not held.shut and init(warn=False))


def current() -> Client | None:
    """The process's client, connecting first if need be (None: no daemon, or shut down)."""
    if held.client is None and not held.shut:
        init()
    return held.client


def shutdown() -> None:
    """Stop monitoring this rank (it is about to exit on purpose)."""
    with held.lock:
        c, held.client, held.shut = held.client, None, True
    if c is not None:
        c.send("bye")
        c.channel.close(linger_ms=SHUTDOWN_LINGER_MS)
