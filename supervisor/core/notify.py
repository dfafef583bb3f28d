"""What the daemon tells the service manager that runs it, as values.

systemd's notify protocol (sd_notify(3)) is a datagram of newline-separated
assignments: ``READY=1``, ``STATUS=...``, ``STOPPING=1``, ``RELOADING=1``,
``WATCHDOG=1``. Which of them follow from which lifecycle event is decided
here, from the event's name and record alone; ``supervisor.runtime.services.sdnotify``
sends them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisor.core.catalogue.daemon import (
    ConfigReloaded,
    ReloadFailed,
    ReloadRequested,
    RunFinished,
    RunStarted,
    StopRequested,
)
from supervisor.core.catalogue.generation import Decision, GenerationStarted, RestartRequested
from supervisor.core.catalogue.ranks import RankSpawned

STATUS_MAX = 200  # `systemctl status` shows one line; a long detail belongs in the event log
VERBS = {"restart": "restarting", "reschedule": "rescheduling", "abort": "aborting"}


def notify_address(value: str | None) -> str | None:
    """The socket address in ``$NOTIFY_SOCKET``: a path, or ``@name`` for an abstract
    socket (a leading NUL for the kernel). None for anything else (vsock: is not ours)."""
    if not value:
        return None
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def watchdog_interval(environ: Mapping[str, str], pid: int) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings: half of ``$WATCHDOG_USEC``, as
    sd_watchdog_enabled(3) advises; None when no watchdog is asked of ``pid``."""
    owner = environ.get("WATCHDOG_PID", "").strip()
    if owner and owner != str(pid):
        return None  # meant for another process of the unit
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None


def _status(text: str) -> str:
    line = " ".join(text.split())  # one line: STATUS ends at a newline
    return "STATUS=" + (line if len(line) <= STATUS_MAX else line[: STATUS_MAX - 3] + "...")


class Narrator:
    """Hears every event; says which notify assignments follow from it.

    It remembers only what the wording needs: whether READY was sent, the local
    ranks spawned for each generation, what the run is doing now (restored after
    a reload), and whether STOPPING was sent.
    """

    def __init__(self) -> None:
        self.ready = False
        self.stopping = False
        self.doing = "starting"
        self._ranks: dict[int, set[int]] = {}

    def hear(self, event: str, record: Mapping[str, Any]) -> tuple[str, ...]:
        gen = record.get("generation")
        said: tuple[str, ...] = ()
        match event:
            case RunStarted.NAME:
                said = (_status(self.doing),)
            case RankSpawned.NAME if isinstance(gen, int):
                self._ranks.setdefault(gen, set()).add(int(record["local_rank"]))
            case GenerationStarted.NAME if isinstance(gen, int):
                said = self._started(gen)
            case Decision.NAME if record.get("action") in VERBS:
                self.doing = f"{VERBS[record['action']]} after {record.get('reason')} (generation {gen})"
                said = (_status(self.doing),)
            case RestartRequested.NAME:
                self.doing = f"restarting generation {gen} on request"
                said = (_status(self.doing),)
            case StopRequested.NAME:
                said = self._stop(f"stopping on {record.get('signal')}")
            case ReloadRequested.NAME:
                # systemd (Type=notify-reload) wants CLOCK_MONOTONIC at the reload's start
                usec = int(float(record["t_mono"]) * 1e6)
                said = ("RELOADING=1", f"MONOTONIC_USEC={usec}", _status(f"reloading {record.get('path')}"))
            case ConfigReloaded.NAME:
                said = ("READY=1", _status(self.doing))
            case ReloadFailed.NAME:
                said = ("READY=1", _status(f"{self.doing}; reload failed: {record.get('error')}"))
            case RunFinished.NAME:
                said = self._stop(f"finished, exit code {record.get('exit_code')}")
        return said

    def _started(self, gen: int) -> tuple[str, ...]:
        ranks = len(self._ranks.get(gen, ()))
        # standbys of the next generation may be spawned already; older ones are history
        self._ranks = {g: r for g, r in self._ranks.items() if g > gen}
        self.doing = f"running generation {gen} with {ranks} rank{'' if ranks == 1 else 's'}"
        first, self.ready = not self.ready, True
        return ("READY=1", _status(self.doing)) if first else (_status(self.doing),)

    def _stop(self, doing: str) -> tuple[str, ...]:
        self.doing = doing
        first, self.stopping = not self.stopping, True
        return ("STOPPING=1", _status(doing)) if first else (_status(doing),)
