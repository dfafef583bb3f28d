"""The command line: ``ft-supervisor run|status|events|stop|restart|classify|plugins|report``.

Each command lives in its own module here; the options of ``run`` and their
validation live in supervisor.config.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Sequence

EXIT_USAGE = 2


def _conflicting_supervisord() -> str | None:
    """supervisord's distribution installs the same import name, ``supervisor``."""
    try:
        dist = importlib.metadata.distribution("supervisor")
    except importlib.metadata.PackageNotFoundError:
        return None
    return dist.version


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ft-supervisor",
        description="Keep distributed PyTorch training alive: launch, watch, restart.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # each command imports what it needs when it runs: `run --help` stays fast
    from supervisor.cli import classify, control, report, run  # noqa: PLC0415

    run.add_command(sub)
    control.add_commands(sub)
    classify.add_commands(sub)
    report.add_commands(sub)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("ft-supervisor")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    clash = _conflicting_supervisord()
    if clash is not None:
        print(
            f"ft-supervisor: the 'supervisor' package (supervisord {clash}) is installed in this "
            "environment. It uses the same import name, 'supervisor', as ft-supervisor, so the two "
            "cannot share one environment: install ft-supervisor in its own virtual environment.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    ns = build_parser().parse_args(argv)
    code: int = ns.handler(ns)
    return code
