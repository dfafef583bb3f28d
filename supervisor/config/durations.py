"""One syntax for every option and setting that takes seconds.

``90`` and ``90.5`` are seconds; ``90s``, ``5m``, ``2h`` and ``1d`` say their unit,
and a sum such as ``1h30m`` gives every part one. The same text works on the
command line, in ``FT_*``/``FT_SUPERVISOR_*`` variables, in a config file (where
YAML or TOML may already have made it a number) and in a section list
(``step:5m``). Negative, not-a-number, infinite and malformed values are refused
with the option's name, never read as something else.
"""

from __future__ import annotations

import argparse
import math
import re

from supervisor.config.errors import ConfigError

UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
FORMS = "a duration such as 90, 90.5, 30s, 5m, 2h, 1d or 1h30m"
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PART = re.compile(rf"({_NUMBER})\s*([smhd]?)")
# one number, with or without its unit, or parts that each end in a unit: a digit run
# can be split only one way, so matching takes linear time whatever the text
_WHOLE = re.compile(rf"{_NUMBER}\s*[smhd]?|(?:{_NUMBER}\s*[smhd]\s*)+")
_MAX_CHARS = 64  # a duration is a few characters: a megabyte of digits is not one


def parse(value: object) -> float:
    """Seconds in ``value``: a number, or text in the one syntax. ``ValueError``
    says why not, without the option's name (the caller knows how it was given)."""
    # YAML's yes/no is a bool, a number to Python: not a duration
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and len(value) <= _MAX_CHARS:
        text = value.strip().lower()
        if text.startswith("-"):
            raise ValueError("a duration cannot be negative")
        if not text or _WHOLE.fullmatch(text) is None:
            raise ValueError(f"expected {FORMS}")
        seconds = sum(float(n) * UNITS[unit] for n, unit in _PART.findall(text))
    else:
        raise ValueError(f"expected {FORMS}")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    if not math.isfinite(seconds):
        raise ValueError(f"expected {FORMS}")
    return seconds


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def seconds(option: str, value: object, *, positive: bool = False) -> float:
    """``value`` in seconds, or a ``ConfigError`` naming ``option`` (``--x``, ``FT_X``,
    ``FILE: key``); ``positive``: 0 is refused too."""
    try:
        result = parse(value)
    except ValueError as exc:
        raise ConfigError(f"{option} {_shown(value)}: {exc}") from None
    if positive and result == 0:
        raise ConfigError(f"{option} {_shown(value)}: must be more than 0 seconds")
    return result


def optional(option: str, value: object, *, positive: bool = False) -> float | None:
    """``seconds``, with None or an empty value meaning not given."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return seconds(option, value, positive=positive)


def whole_seconds(option: str, value: object, *, least: int = 0) -> int:
    """A duration that must come to whole seconds (torch's rendezvous timeouts are ints)."""
    result = seconds(option, value)
    if result != int(result) or result < least:
        raise ConfigError(f"{option} {_shown(value)}: expected a whole number of seconds >= {least}")
    return int(result)


def duration(text: str) -> float:
    """``type=`` for an argparse option that takes seconds (>= 0)."""
    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{_shown(text)}: {exc}") from None
