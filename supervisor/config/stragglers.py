"""Straggler detection: ``--straggler-*``.

On by default and only reporting (events, ``status``, a metric, the report):
it costs the daemon a median per rank a second. ``--straggler-action restart``
or ``reschedule`` acts on a rank that stays slow, within the restart budget.
Each option reads ``FT_SUPERVISOR_<OPTION>`` when not given; every problem
raises ``ConfigError`` naming the option.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping

from supervisor.config import durations
from supervisor.config.environment import pick
from supervisor.config.errors import ConfigError
from supervisor.core.stragglers import StragglerAction, StragglerSettings

DEFAULTS = StragglerSettings()


def add_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--straggler-detection",
        default=None,
        choices=("on", "off"),
        help="score each rank's own work per step against the node's ranks (default on)",
    )
    g.add_argument(
        "--straggler-action",
        default=None,
        choices=[str(a) for a in StragglerAction],
        help="what a rank that stays slow makes the node do: report it (default), restart the job, or "
        "reschedule (leave with the reschedule code and mark the node's health ledger); restart and "
        "reschedule only while --max-restarts has a restart left",
    )
    g.add_argument(
        "--straggler-threshold",
        default=None,
        metavar="RATIO",
        help=f"a rank this many times slower than the node's typical rank is a straggler "
        f"(default {DEFAULTS.threshold:g}; cleared below 1 + half the excess)",
    )
    g.add_argument(
        "--straggler-window",
        default=None,
        metavar="STEPS",
        help=f"steps per rank a score is the median of (default {DEFAULTS.window})",
    )
    g.add_argument(
        "--straggler-warmup",
        default=None,
        metavar="STEPS",
        help=f"first steps of each rank and generation left out (default {DEFAULTS.warmup})",
    )
    g.add_argument(
        "--straggler-sustain",
        default=None,
        metavar="DURATION",
        help=f"how long a score must stay above the threshold (below the clear level) to flag "
        f"(clear) a rank (default {DEFAULTS.sustain:g}s); scores are judged every second, or four times "
        "per DURATION when shorter",
    )


def _number(ns: argparse.Namespace, environ: Mapping[str, str], option: str, default: float) -> float:
    raw = pick(ns, environ, option)
    if raw is None or not str(raw).strip():
        return default
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise ConfigError(f"{option} {raw!r}: expected a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"{option} {raw!r}: expected a finite number")
    return value


def _count(ns: argparse.Namespace, environ: Mapping[str, str], option: str, default: int, least: int) -> int:
    value = _number(ns, environ, option, default)
    if value != int(value) or value < least:
        raise ConfigError(f"{option} {value:g}: expected a whole number >= {least}")
    return int(value)


def from_namespace(ns: argparse.Namespace, environ: Mapping[str, str]) -> StragglerSettings:
    detection = str(pick(ns, environ, "--straggler-detection") or "on").strip().lower()
    if detection not in ("on", "off"):
        raise ConfigError(f"--straggler-detection {detection!r}: expected on or off")
    action_text = str(pick(ns, environ, "--straggler-action") or "report").strip().lower()
    try:
        action = StragglerAction(action_text)
    except ValueError:
        choices = ", ".join(a.value for a in StragglerAction)
        raise ConfigError(f"--straggler-action {action_text!r}: expected one of {choices}") from None
    threshold = _number(ns, environ, "--straggler-threshold", DEFAULTS.threshold)
    if threshold <= 1.0:
        raise ConfigError(f"--straggler-threshold {threshold:g}: must be > 1 (a ratio to the typical rank)")
    given = durations.optional("--straggler-sustain", pick(ns, environ, "--straggler-sustain"))
    sustain = DEFAULTS.sustain if given is None else given
    return StragglerSettings(
        enabled=detection == "on",
        threshold=threshold,
        clear=1.0 + (threshold - 1.0) / 2,
        window=_count(ns, environ, "--straggler-window", DEFAULTS.window, 3),
        warmup=_count(ns, environ, "--straggler-warmup", DEFAULTS.warmup, 0),
        sustain=sustain,
        # scores are judged once a second, or four times per sustain when that is shorter
        interval=min(DEFAULTS.interval, max(0.1, sustain / 4)),
        action=action,
    )
