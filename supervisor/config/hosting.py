"""How the daemon behaves as a service: which signals stop, reload or pass through,
and what a reload re-reads.

SIGHUP is one of torchrun's stop signals. A run with a config file
(``--ft-cfg-path`` / ``FAULT_TOL_CFG_PATH``) takes SIGHUP as "reload the file"
instead, as daemons do (``systemctl reload``): it leaves the default stop
signals, and listing it in ``--signals-to-handle`` next to a config file is an
error naming both. Without a config file it stays a stop signal.

A reload merges the file with the same precedence as at start: the ``--ft-*``
options and ``FT_*`` variables given at start still win over it. The file's
``log_level`` is NVRx's own logging: the daemon's console follows ``--log-level``.

``--forward-signals`` (``FT_SUPERVISOR_FORWARD_SIGNALS``; default SIGUSR2,SIGWINCH)
names signals passed on to the running ranks' process groups: in a container the
daemon is PID 1, the only process a ``docker kill -s`` reaches, and an
application that relies on one of them must still get it.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.config import ft as ftconfig
from supervisor.config.errors import ConfigError

DEFAULT_FORWARD = "SIGUSR2,SIGWINCH"
FORWARD_ENV = "FT_SUPERVISOR_FORWARD_SIGNALS"


class StoreGiven(argparse.Action):
    """Store the value and remember that the command line gave it (``<dest>_given``):
    a default cannot tell "not given" from "given the default value"."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


@dataclass(frozen=True, slots=True)
class HostingConfig:
    config_file: Path | None = None  # what SIGHUP re-reads; None: SIGHUP stops the run (torchrun's way)
    ft_overrides: Mapping[str, object] = field(default_factory=dict)  # --ft-* at start: they outrank it
    ft_environ: Mapping[str, str] = field(default_factory=dict)  # FT_* at start: they outrank it too
    forward_signals: tuple[int, ...] = (signal.SIGUSR2, signal.SIGWINCH)

    @property
    def reload_signals(self) -> tuple[int, ...]:
        return (signal.SIGHUP,) if self.config_file is not None else ()


def add_options(group: Any) -> None:
    group.add_argument(
        "--forward-signals",
        default=None,
        metavar="SIGNALS",
        help=f"signals passed on to the running ranks (default {DEFAULT_FORWARD}; none: none). "
        "With a config file (--ft-cfg-path) SIGHUP reloads it instead of stopping the run",
    )


def _signals(option: str, value: str) -> tuple[int, ...]:
    out = []
    for raw in filter(None, (s.strip().upper() for s in value.split(","))):
        name = raw if raw.startswith("SIG") else "SIG" + raw
        try:
            out.append(int(signal.Signals[name]))
        except KeyError:
            raise ConfigError(f"{option} {value!r}: unknown signal {name}") from None
    return tuple(out)


def config_file(ns: argparse.Namespace, environ: Mapping[str, str]) -> tuple[Path | None, str]:
    """The fault-tolerance config file, and how the user named it (for messages)."""
    if ns.ft_cfg_path:
        return Path(ns.ft_cfg_path).absolute(), f"--ft-cfg-path {ns.ft_cfg_path}"
    if environ.get("FAULT_TOL_CFG_PATH"):
        path = environ["FAULT_TOL_CFG_PATH"]
        return Path(path).absolute(), f"FAULT_TOL_CFG_PATH={path}"
    return None, ""


def stop_signals(
    parsed: tuple[int, ...], ns: argparse.Namespace, environ: Mapping[str, str], default: str
) -> tuple[int, ...]:
    """``--signals-to-handle`` (already ``parsed``) under the SIGHUP rule."""
    path, named = config_file(ns, environ)
    if path is None or signal.SIGHUP not in parsed:
        return parsed
    given = getattr(ns, "signals_to_handle_given", False) or ns.signals_to_handle != default
    if given:
        raise ConfigError(
            f"--signals-to-handle {ns.signals_to_handle} lists SIGHUP, but with a config file "
            f"({named}) SIGHUP reloads it: leave SIGHUP out of --signals-to-handle"
        )
    return tuple(s for s in parsed if s != signal.SIGHUP)


def from_namespace(
    ns: argparse.Namespace, environ: Mapping[str, str], stops: tuple[int, ...]
) -> HostingConfig:
    path, _ = config_file(ns, environ)
    raw = ns.forward_signals if ns.forward_signals is not None else environ.get(FORWARD_ENV, DEFAULT_FORWARD)
    option = "--forward-signals" if ns.forward_signals is not None else FORWARD_ENV
    forward = () if raw.strip().lower() in ("", "none") else _signals(option, raw)
    for signum in forward:
        if signum in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            raise ConfigError(f"{option} {raw!r}: {signal.Signals(signum).name} cannot be forwarded")
    if path is not None and signal.SIGHUP in forward:
        raise ConfigError(f"{option} {raw!r}: with a config file SIGHUP reloads it")
    return HostingConfig(
        config_file=path,
        ft_overrides=ftconfig.cli_settings(ns),
        ft_environ={k: v for k, v in environ.items() if k.startswith("FT_")},
        # a stop signal is forwarded by the termination procedure already
        forward_signals=tuple(dict.fromkeys(s for s in forward if s not in stops)),
    )
