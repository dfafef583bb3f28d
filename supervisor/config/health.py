"""The node's health across runs: where its ledger lives (``--node-state-dir``) and
when it keeps its ranks off (``--node-quarantine COUNT/WINDOW``).

The ledger is kept always (a hardware-looking failure writes a line or two); the
quarantine is off unless asked for. Both options read ``FT_SUPERVISOR_<OPTION>``
when not given.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.config import durations
from supervisor.config.environment import pick
from supervisor.config.errors import ConfigError
from supervisor.core.health import Quarantine

LEDGER_NAME = "node-health.json"


def default_state_dir(environ: Mapping[str, str]) -> Path:
    """$XDG_STATE_HOME/ft-supervisor, else ~/.local/state/ft-supervisor: it outlives runs."""
    base = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "ft-supervisor"


@dataclass(frozen=True, slots=True)
class HealthConfig:
    state_dir: Path = field(default_factory=lambda: default_state_dir(os.environ))
    quarantine: Quarantine | None = None  # None: the ledger is kept, never enforced

    @property
    def ledger(self) -> Path:
        return self.state_dir / LEDGER_NAME


def add_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--node-state-dir",
        default=None,
        metavar="DIR",
        help="where this node's health ledger lives across runs (default $XDG_STATE_HOME/ft-supervisor)",
    )
    g.add_argument(
        "--node-quarantine",
        default=None,
        metavar="COUNT/WINDOW",
        help="start no ranks (exit with the reschedule code) once the ledger holds COUNT hardware-looking "
        "failures (Xid, ECC, NVLink, NIC, unkillable ranks) within WINDOW, e.g. 3/24h; default off",
    )


def quarantine_of(text: str | None, option: str = "--node-quarantine") -> Quarantine | None:
    if text is None or not str(text).strip() or str(text).strip().lower() == "off":
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\S+)\s*", str(text))
    if m is None:
        raise ConfigError(f"{option} {text!r}: expected COUNT/WINDOW such as 3/24h")
    if int(m.group(1)) < 1:
        raise ConfigError(f"{option} {text!r}: COUNT must be at least 1")
    try:
        window = durations.parse(m.group(2))
    except ValueError as exc:
        raise ConfigError(f"{option} {text!r}: WINDOW: {exc}") from None
    if window == 0:
        raise ConfigError(f"{option} {text!r}: WINDOW must be more than 0 seconds")
    return Quarantine(int(m.group(1)), window)


def from_namespace(ns: argparse.Namespace, environ: Mapping[str, str]) -> HealthConfig:
    given = pick(ns, environ, "--node-state-dir")
    state_dir = Path(given).absolute() if given else default_state_dir(environ)
    return HealthConfig(state_dir=state_dir, quarantine=quarantine_of(pick(ns, environ, "--node-quarantine")))
