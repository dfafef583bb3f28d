"""The command line: ``ft-supervisor run|status|events|stop|restart|classify|plugins|report|node``.

Each command lives in its own module here; the options of ``run`` and their
validation live in supervisor.config.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
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


# The module under supervisor.cli that adds each command, in the order --help lists them.
# A command line naming one of these builds that module's commands only: `status` then
# costs ~0.2 CPU-s, not ~0.4 (the other modules import the daemon's configuration and
# classifier). No command, an option first (--help, --version) or an unknown one: all.
COMMANDS = {"run": "run", "status": "control", "events": "control", "stop": "control",
            "restart": "control", "classify": "classify", "plugins": "classify",
            "report": "report", "node": "node"}  # fmt: skip


def _has_distribution_named_supervisor(entry: str) -> bool:
    try:
        names = [(p.name.lower(), p.suffix) for p in Path(entry or ".").iterdir()]
    except OSError:
        return False  # a zip, or gone: importlib.metadata is asked when a directory says so
    return any(
        name.startswith(("supervisor-", "supervisor.")) and suffix in (".dist-info", ".egg-info")
        for name, suffix in names
    )


def _conflicting_supervisord() -> str | None:
    """supervisord's distribution installs the same import name, ``supervisor``.

    importlib.metadata is imported (~50 ms of CPU, every command and every daemon) only
    when a path entry holds a distribution of that name."""
    if not any(_has_distribution_named_supervisor(entry) for entry in sys.path):
        return None
    import importlib.metadata  # noqa: PLC0415

    try:
        dist = importlib.metadata.distribution("supervisor")
    except importlib.metadata.PackageNotFoundError:
        return None
    return dist.version


class _Version(argparse.Action):
    """``--version``: the number is read (importlib.metadata) only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show program's version number and exit")  # fmt: skip

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"{parser.prog} {_version()}")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or only the module of ``command``'s (``COMMANDS``)."""
    parser = Parser(
        prog="ft-supervisor",
        description="Keep distributed PyTorch training alive: launch, watch, restart.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # each command imports what it needs when it runs: `run --help` stays fast
    names = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for name in names:
        module = importlib.import_module(f"supervisor.cli.{name}")
        (module.add_command if name == "run" else module.add_commands)(sub)
    return parser


def _version() -> str:
    import importlib.metadata  # noqa: PLC0415

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
        args = sys.argv[1:] if argv is None else list(argv)
        ns = build_parser(next(iter(args), None)).parse_args(args)
        code: int = ns.handler(ns)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`report --json | head`): what it wanted it had
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_SIGPIPE
    return code
