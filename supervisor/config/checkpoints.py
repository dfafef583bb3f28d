"""Checkpoint sync options: where the ranks write checkpoints (LOCAL), where they are
kept (DEST), how often they are copied there, and how many are kept.

    --checkpoint-path LOCAL --checkpoint-url DEST --checkpoint-frequency 5m

Each option also comes from an environment variable of the same name
(``--checkpoint-url`` / ``FT_SUPERVISOR_CHECKPOINT_URL``), handy in a container
entrypoint; the command line wins. Every problem raises ``ConfigError``
naming the option.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.config import durations
from supervisor.config.environment import pick
from supervisor.config.errors import ConfigError
from supervisor.core.snapshots import SETTLE_S

FSSPEC_HINT = "pip install 'ft-supervisor[fsspec]'"


def split_url(url: str) -> tuple[str | None, str]:
    """(scheme, location): no scheme for a local path (a ``file://`` URL included)."""
    m = re.fullmatch(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", url.strip(), flags=re.DOTALL)
    if m is None:
        return None, url
    scheme = m.group(1).lower()
    if scheme == "file":
        return None, m.group(2)
    return scheme, url


def check_url(url: str) -> str | None:
    """What is wrong with a destination, or None; imports fsspec only for a scheme."""
    scheme, location = split_url(url)
    if scheme is None:
        return None if location.strip() else "is empty"
    try:
        import fsspec  # noqa: PLC0415 - the optional extra
    except ImportError:
        return f"the {scheme}:// scheme needs fsspec: {FSSPEC_HINT}"
    try:
        fsspec.get_filesystem_class(scheme)
    except (ValueError, ImportError) as exc:
        return f"scheme {scheme}://: {exc}"
    return None


DEFAULT_FREQUENCY = 300.0
DEFAULT_FINAL_TIMEOUT = 300.0
DEFAULT_RESTORE_TIMEOUT = 600.0


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    path: Path  # LOCAL, absolute
    url: str  # DEST: a directory, file://, or any fsspec URL
    frequency: float = DEFAULT_FREQUENCY  # seconds between syncs
    keep: int | None = None  # None: keep every entry at DEST
    final_timeout: float = DEFAULT_FINAL_TIMEOUT  # bound on the sync when the run ends
    restore_timeout: float = DEFAULT_RESTORE_TIMEOUT  # bound on the copy-back before the ranks start
    settle: float = SETTLE_S  # an entry written to this recently is not uploaded yet


def add_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--checkpoint-path",
        default=None,
        help="the local directory the ranks write checkpoints into (LOCAL); each top-level "
        "file or directory in it is one checkpoint",
    )
    g.add_argument(
        "--checkpoint-url",
        default=None,
        help="where checkpoints are kept (DEST): a directory, a mounted filesystem, or an "
        "fsspec URL such as s3://bucket/run (pip install 'ft-supervisor[fsspec]'); the newest "
        "is copied back into LOCAL before the ranks start",
    )
    g.add_argument(
        "--checkpoint-frequency",
        default=None,
        help="how often new or changed checkpoints are copied to DEST: 90 (seconds), 30s, 5m, "
        "1h (default 5m); and once more when the run ends",
    )
    g.add_argument(
        "--checkpoint-keep",
        default=None,
        help="keep only the K newest checkpoints at DEST (default: all); LOCAL is never touched",
    )
    g.add_argument(
        "--checkpoint-final-timeout",
        default=None,
        help="how long the last sync, when the run ends, may take (default 300s)",
    )
    g.add_argument(
        "--checkpoint-restore-timeout",
        default=None,
        help="how long the copy-back before the ranks start may take; past it they start with "
        "what LOCAL has (default 600s)",
    )
    g.add_argument(
        "--checkpoint-settle",
        default=None,
        help="seconds a checkpoint must go unwritten before it is copied, so that one being "
        f"written is not (default {SETTLE_S:g}; the last sync, after the ranks, does not wait)",
    )


def _duration(option: str, value: Any, default: float) -> float:
    seconds = durations.optional(option, value, positive=True)
    return default if seconds is None else seconds


def _overlap(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def from_namespace(ns: argparse.Namespace, environ: Mapping[str, str]) -> CheckpointConfig | None:
    """The checkpoint sync settings; None when no checkpoint option is given."""
    path = pick(ns, environ, "--checkpoint-path")
    url = pick(ns, environ, "--checkpoint-url")
    others = [o for o in ("--checkpoint-frequency", "--checkpoint-keep", "--checkpoint-final-timeout",
                          "--checkpoint-restore-timeout", "--checkpoint-settle")
              if pick(ns, environ, o) is not None]  # fmt: skip
    if not path and not url:
        if others:
            raise ConfigError(f"{others[0]} needs --checkpoint-path and --checkpoint-url")
        return None
    if not url:
        raise ConfigError("--checkpoint-path needs --checkpoint-url: where should checkpoints go?")
    if not path:
        raise ConfigError(
            "--checkpoint-url needs --checkpoint-path: which directory do ranks write?"
        )
    local = Path(path).absolute()
    if local.exists() and not local.is_dir():
        raise ConfigError(f"--checkpoint-path {path}: exists and is not a directory")
    problem = check_url(url)
    if problem is not None:
        raise ConfigError(f"--checkpoint-url {url}: {problem}")
    scheme, location = split_url(url)
    if scheme is None and _overlap(local, Path(location).absolute()):
        raise ConfigError(
            f"--checkpoint-url {url} and --checkpoint-path {path} overlap: DEST must be "
            "another directory, neither inside LOCAL nor containing it"
        )
    keep = pick(ns, environ, "--checkpoint-keep")
    if keep is not None:
        try:
            keep = int(keep)
        except ValueError:
            raise ConfigError(f"--checkpoint-keep {keep!r}: expected a whole number") from None
        if keep < 1:
            raise ConfigError(f"--checkpoint-keep {keep}: must be at least 1")
    settle = durations.optional("--checkpoint-settle", pick(ns, environ, "--checkpoint-settle"))
    return CheckpointConfig(
        path=local,
        url=str(Path(location).absolute()) if scheme is None else url,
        frequency=_duration(
            "--checkpoint-frequency", pick(ns, environ, "--checkpoint-frequency"), DEFAULT_FREQUENCY
        ),
        keep=keep,
        final_timeout=_duration(
            "--checkpoint-final-timeout",
            pick(ns, environ, "--checkpoint-final-timeout"),
            DEFAULT_FINAL_TIMEOUT,
        ),
        restore_timeout=_duration(
            "--checkpoint-restore-timeout",
            pick(ns, environ, "--checkpoint-restore-timeout"),
            DEFAULT_RESTORE_TIMEOUT,
        ),
        settle=SETTLE_S if settle is None else settle,
    )
