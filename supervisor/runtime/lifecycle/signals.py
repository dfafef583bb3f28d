"""Signals become commands on the daemon's queue; the loop decides what they mean.

Stop signals (``--signals-to-handle``, torchrun's SIGTERM,SIGINT,SIGHUP,SIGQUIT by
default) stop the run gracefully; a second SIGINT forces it. SIGUSR1 asks for a
status dump, unless the user made it a stop signal. With a config file, SIGHUP
reloads it instead of stopping; SIGUSR2 and SIGWINCH are passed on to the ranks
(``supervisor.config.hosting`` says which signals do what).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stop:
    signum: int


@dataclass(frozen=True, slots=True)
class DumpStatus:
    pass


@dataclass(frozen=True, slots=True)
class Reload:
    pass


@dataclass(frozen=True, slots=True)
class Forward:
    signum: int


Command = Stop | DumpStatus | Reload | Forward


def install(
    queue: asyncio.Queue[Command],
    stop_signals: Iterable[int],
    reload_signals: Iterable[int] = (),
    forward_signals: Iterable[int] = (),
) -> list[int]:
    """Route signals into ``queue``; return the signals now handled."""
    loop = asyncio.get_running_loop()
    handled = []
    for signum in stop_signals:
        loop.add_signal_handler(signum, queue.put_nowait, Stop(signum))
        handled.append(signum)
    for signum in reload_signals:
        loop.add_signal_handler(signum, queue.put_nowait, Reload())
        handled.append(signum)
    for signum in forward_signals:
        loop.add_signal_handler(signum, queue.put_nowait, Forward(signum))
        handled.append(signum)
    if signal.SIGUSR1 not in handled:
        loop.add_signal_handler(signal.SIGUSR1, queue.put_nowait, DumpStatus())
        handled.append(signal.SIGUSR1)
    return handled


def uninstall(signums: Iterable[int]) -> None:
    loop = asyncio.get_running_loop()
    for signum in signums:
        loop.remove_signal_handler(signum)


def forwarded(signum: int) -> int:
    """The signal ranks get when the run is stopped by ``signum``.

    A terminal's Ctrl-C and a scheduler's SIGTERM both mean "stop": ranks get
    SIGTERM. Other stop signals (SIGHUP, SIGQUIT, SIGUSR1 on SLURM...) are
    forwarded as they came, as torchrun does, since a rank may handle them.
    """
    return signal.SIGTERM if signum in (signal.SIGINT, signal.SIGTERM) else signum
