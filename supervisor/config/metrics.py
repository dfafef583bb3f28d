"""The optional Prometheus endpoint: ``--metrics-port`` and ``--metrics-addr``.

Off unless a port is given. Each option has an environment variable of the same
name (``--metrics-port`` / ``FT_SUPERVISOR_METRICS_PORT``); the command line
wins. The endpoint listens on the loopback address unless another one is given
explicitly: the figures name hosts, ranks and failures, and a daemon should not
publish them to the network by default. Every problem raises
``ConfigError`` naming the option.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.config.environment import pick
from supervisor.config.errors import ConfigError

LOOPBACK = "127.0.0.1"
EXTRA_HINT = "pip install 'ft-supervisor[metrics]'"


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    port: int | None = None  # None: no endpoint; 0: any free port (the metrics_serving event says which)
    addr: str = LOOPBACK

    @property
    def enabled(self) -> bool:
        return self.port is not None


def add_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--metrics-port",
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (0: a free port, named in the "
        f"metrics_serving event); needs {EXTRA_HINT}",
    )
    g.add_argument(
        "--metrics-addr",
        default=None,
        metavar="ADDR",
        help=f"the address the metrics endpoint listens on (default {LOOPBACK}; any other "
        "address publishes the figures beyond this machine)",
    )


def _port(text: str) -> int:
    try:
        port = int(text.strip())
    except ValueError:
        raise ConfigError(f"--metrics-port {text!r}: expected a port number 0-65535") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"--metrics-port {port}: expected 0-65535 (0: any free port)")
    return port


_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")


def _addr(text: str) -> str:
    """An IP address, or a host name (looked up when the endpoint binds, not here: no DNS at parse time)."""
    addr = text.strip()
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        if not _HOSTNAME.fullmatch(addr):
            raise ConfigError(
                f"--metrics-addr {text!r}: expected an IP address (such as 127.0.0.1 or ::1) or a host name"
            ) from None
    return addr


def _require_client() -> None:
    try:
        import prometheus_client  # noqa: F401, PLC0415 - the optional extra, only when asked for
    except ImportError:
        raise ConfigError(
            f"--metrics-port needs the prometheus-client package: {EXTRA_HINT}"
        ) from None


def from_namespace(ns: argparse.Namespace, environ: Mapping[str, str]) -> MetricsConfig:
    port = _text(ns, environ, "--metrics-port")
    addr = _text(ns, environ, "--metrics-addr")
    if port is None or not port.strip():
        if addr is not None:
            raise ConfigError(f"--metrics-addr {addr!r} without --metrics-port: metrics are off")
        return MetricsConfig()
    cfg = MetricsConfig(port=_port(port), addr=LOOPBACK if addr is None else _addr(addr))
    _require_client()
    return cfg


def _text(ns: argparse.Namespace, environ: Mapping[str, str], option: str) -> str | None:
    value = pick(ns, environ, option)
    return None if value is None else str(value)
