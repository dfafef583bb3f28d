"""SIGHUP: re-read the config file and apply what can change under running ranks.

The hang-detection timeouts go to the monitor at once (the running generation's
deadlines are re-armed; learned timeouts still take precedence, as at start). The
file's ``log_level`` is NVRx's own logging and never changes the daemon's. Other
settings that changed are reported as ``not_applied``: they take effect when the
daemon starts again. The ranks are
never touched. A file that does not load changes nothing: ``reload_failed``
says why, and the settings in force stay as they were.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from supervisor.config import ft as ftconfig
from supervisor.config.errors import ConfigError
from supervisor.config.ft import FtConfig
from supervisor.config.run import RunConfig
from supervisor.core.catalogue.daemon import ConfigReloaded, ReloadFailed, ReloadRequested
from supervisor.runtime.lifecycle import status
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.records.events import EventLog

TIMEOUTS = frozenset(
    {
        "initial_rank_heartbeat_timeout",
        "rank_heartbeat_timeout",
        "rank_section_timeouts",
        "rank_out_of_section_timeout",
        "num_warmup_iterations",
    }
)
APPLIED = TIMEOUTS


def _plain(value: object) -> object:
    return dict(value) if isinstance(value, Mapping) else value  # a section map, as JSON


def changes(old: FtConfig, new: FtConfig) -> dict[str, dict[str, Any]]:
    """Settings whose value differs: {name: {"from": old, "to": new}}."""
    out = {}
    for f in fields(FtConfig):
        before, after = _plain(getattr(old, f.name)), _plain(getattr(new, f.name))
        if f.name != "ignored" and before != after:
            out[f.name] = {"from": before, "to": after}
    return out


class Reloader:
    def __init__(self, cfg: RunConfig, monitor: Monitor, logger: logging.Logger, events: EventLog) -> None:
        self._hosting = cfg.hosting
        self._ft = cfg.ft  # the settings in force
        self._monitor = monitor
        self._logger = logger
        self._events = events

    async def reload(self) -> None:
        path = self._hosting.config_file
        if path is None:
            return  # without a file SIGHUP is a stop signal and never comes here
        self._events.emit(ReloadRequested(path=str(path)))
        h = self._hosting
        try:
            # off the loop: the worst file the reader accepts takes seconds to parse
            new = await asyncio.to_thread(ftconfig.load, h.ft_overrides, h.ft_environ, path)
        except ConfigError as exc:
            self._events.emit(ReloadFailed(path=str(path), error=str(exc)))
            return
        except Exception as exc:  # a file is input: whatever it does, the run goes on
            error = f"{type(exc).__name__}: {exc}"
            self._events.emit(ReloadFailed(path=str(path), error=error), logging.ERROR)
            return
        changed = changes(self._ft, new)
        if TIMEOUTS & changed.keys():
            self._monitor.configured = new.timeouts()
            self._monitor.set_learned(self._monitor.learned)  # recomputes and re-arms the deadlines
        not_applied = sorted(changed.keys() - APPLIED)
        # what was not applied stays as it was, and is reported again by the next reload
        self._ft = replace(new, **{k: getattr(self._ft, k) for k in not_applied})
        self._events.emit(
            ConfigReloaded(
                path=str(path),
                changed={k: v for k, v in changed.items() if k in APPLIED} or None,
                not_applied=not_applied or None,
                timeouts=status.timeouts(self._monitor),
            ),
        )
