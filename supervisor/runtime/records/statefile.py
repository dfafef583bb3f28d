"""Learned timeouts that outlive a run: ``<state dir>/timeouts.json``.

Written atomically (temporary file, fsync, rename) so a crash mid-write leaves
the previous state, never a torn one. A file that cannot be read or parsed is
reported and ignored: learning starts over, the run goes on.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from supervisor.core.learning import Learned

VERSION = 1


def path_in(state_dir: Path) -> Path:
    return state_dir / "timeouts.json"


def load(path: Path) -> tuple[Learned, str | None]:
    """The learned timeouts, and a problem to report (None when fine or absent)."""
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return Learned(), None
    except (OSError, orjson.JSONDecodeError) as exc:
        return Learned(), f"{path}: {exc}"
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return Learned(), f"{path}: not a version {VERSION} timeouts file"
    return Learned.from_json(data.get("learned")), None


def save(path: Path, learned: Learned, **about: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        f.write(orjson.dumps({"version": VERSION, "learned": learned.to_json(), **about}))
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
