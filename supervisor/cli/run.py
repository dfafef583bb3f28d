"""``ft-supervisor run [torchrun options] SCRIPT [ARGS...]``: replacing ``torchrun``
with ``ft-supervisor run`` is the whole migration."""

from __future__ import annotations

import argparse
import os
from typing import Any

from supervisor.config.build import build_run_config
from supervisor.config.errors import ConfigError
from supervisor.config.options import add_run_options


def add_command(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="launch the ranks of this node (torchrun-compatible) and supervise them",
        description="Launch and supervise the ranks of one node. Accepts torchrun's options.",
        # a prefix of one of our options after the script (train.py --kill 3) belongs to the
        # script: argparse would take it as ours, or fail as ambiguous
        allow_abbrev=False,
    )
    add_run_options(p)
    p.add_argument("training_script", help="the training program (or module with -m)")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    p.set_defaults(handler=_run, command_parser=p)
    return p




def _run(ns: argparse.Namespace) -> int:
    try:
        config = build_run_config(ns, os.environ)
    except ConfigError as exc:
        ns.command_parser.error(str(exc))  # prints usage and the message; exits 2
    from supervisor.runtime.lifecycle.daemon import run_daemon  # noqa: PLC0415 - keeps --help fast

    return run_daemon(config)


