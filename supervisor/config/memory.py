"""``--snapshot-memory``: how much memory the snapshots the daemon holds may take.

``2G``, ``512M``, ``64K``, ``1T`` and ``1073741824`` are bytes (the suffixes are powers
of 1024, an optional ``B`` or ``iB`` after them); a number with a decimal point, from
0 to 1 (``0.25``, ``1.0``), is a fraction of the node's memory (MemTotal); ``0`` holds
no snapshot at all. The daemon further bounds it by /dev/shm's free space.
"""

from __future__ import annotations

import os
import re

from supervisor.config.errors import ConfigError

DEFAULT = "0.25"  # a quarter of the node's memory
FORMS = "bytes such as 512M, 2G or 1073741824, or a fraction of the node's memory such as 0.25"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_BYTES = re.compile(r"(\d{1,16})\s*([kmgt]?)(?:i?b)?")
_FRACTION = re.compile(r"(?:0|1)?\.\d{1,9}|[01]\.")
_MAX_CHARS = 32


def mem_total() -> int:
    """The node's memory, in bytes (0 when it cannot be read)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


REPLICATION_DEFAULT = "256M"  # bytes a second: see --snapshot-replication-rate's help
RATE_FORMS = "bytes a second such as 256M, 1G or 0 (off)"


def parse_rate(text: str) -> int:
    """``--snapshot-replication-rate``: bytes a second (the same suffixes; 0 is off)."""
    found = _BYTES.fullmatch(text.strip().lower() if len(text) <= _MAX_CHARS else "")
    if found is None:
        raise ConfigError(f"--snapshot-replication-rate {text[:_MAX_CHARS]!r}: expected {RATE_FORMS}")
    return int(found.group(1)) * _UNITS[found.group(2)]


def parse(text: str, total: int) -> int:
    """Bytes meant by ``text``; ``total``: the node's memory a fraction is of."""
    value = text.strip().lower() if len(text) <= _MAX_CHARS else ""
    if _FRACTION.fullmatch(value):
        fraction = float(value)
        if not 0 <= fraction <= 1:
            raise ConfigError(f"--snapshot-memory {text}: a fraction of memory is from 0 to 1")
        return int(fraction * total)
    found = _BYTES.fullmatch(value)
    if found is None:
        raise ConfigError(f"--snapshot-memory {text[:_MAX_CHARS]!r}: expected {FORMS}")
    return int(found.group(1)) * _UNITS[found.group(2)]
