"""What every rank of a run executes: a script, a module or a program."""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Program:
    """What every rank runs: ``kind`` is script, module or exec (``--no-python``)."""

    kind: str
    target: str
    args: tuple[str, ...] = ()
    python: str = sys.executable
    preload: tuple[str, ...] = ()
    fast_exit: bool = True
