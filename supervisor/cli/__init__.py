"""The command line: ``ft-supervisor run|status|events|stop|restart|classify|plugins|report|node``.

Each command lives in its own module here; the options of ``run`` and their
validation live in supervisor.config.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

EXIT_USAGE = 2
EXIT_SIGPIPE = 128 + signal.SIGPIPE  # what a shell reports for `... | head`


class Formatter(argparse.HelpFormatter):
    """Each option once, in its first spelling: the aliases (``--nproc_per_node``,
    ``--ft-param-...``) are accepted but need not fill the help."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings:
            return super()._format_action_invocation(action)
        short = [s for s in action.option_strings if not s.startswith("--")][:1]
        long = [s for s in action.option_strings if s.startswith("--")][:1]
        shown = ", ".join(short + long)
        if action.nargs == 0:
            return shown
        return f"{shown} {self._format_args(action, self._get_default_metavar_for_optional(action))}"


class Parser(argparse.ArgumentParser):
    """A usage error is one line naming the problem, not the usage block before it."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kw)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _conflicting_supervisord() -> str | None:
    """supervisord's distribution installs the same import name, ``supervisor``."""
    try:
        dist = importlib.metadata.distribution("supervisor")
    except importlib.metadata.PackageNotFoundError:
        return None
    return dist.version


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="ft-supervisor",
        description="Keep distributed PyTorch training alive: launch, watch, restart.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # each command imports what it needs when it runs: `run --help` stays fast
    from supervisor.cli import classify, control, node, report, run  # noqa: PLC0415

    run.add_command(sub)
    control.add_commands(sub)
    classify.add_commands(sub)
    report.add_commands(sub)
    node.add_commands(sub)
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
    try:
        ns = build_parser().parse_args(argv)
        code: int = ns.handler(ns)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`report --json | head`): what it wanted it had
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_SIGPIPE
    return code
