"""``ft-supervisor run [torchrun options] SCRIPT [ARGS...]``: replacing ``torchrun``
with ``ft-supervisor run`` is the whole migration."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import Any

from supervisor.config.build import build_run_config
from supervisor.config.errors import ConfigError
from supervisor.config.options import add_run_options, hide_the_rest


def add_command(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="launch the ranks of this node (torchrun-compatible) and supervise them",
        description="Launch and supervise the ranks of one node. Accepts torchrun's options.",
        # a prefix of one of our options after the script (train.py --kill 3) belongs to the
        # script: argparse would take it as ours, or fail as ambiguous
        allow_abbrev=False,
        usage="%(prog)s [options] SCRIPT [ARGS...]",
    )
    add_run_options(p)
    p.add_argument("training_script", metavar="SCRIPT", help="the training program (or module with -m)")
    p.add_argument("training_script_args", metavar="ARGS", nargs=argparse.REMAINDER, help="its arguments")
    hidden = hide_the_rest(p)
    p.epilog = (
        f"{hidden} more options (hang detection, policy, service, checkpoint sync, node health): --help-all"
    )
    p.set_defaults(handler=_run, command_parser=p)
    return p


def _run(ns: argparse.Namespace) -> int:
    try:
        config = build_run_config(ns, os.environ)
    except ConfigError as exc:
        ns.command_parser.error(str(exc))  # one line naming the option; exits 2
    from supervisor.runtime.lifecycle.start import run_daemon  # noqa: PLC0415 - keeps --help fast

    code = run_daemon(config)
    if config.rdzv is not None and any(t.daemon and t.is_alive() for t in threading.enumerate()):
        # a thread left blocked in torch's C++ rendezvous (a round that will never
        # complete) makes the interpreter's shutdown call std::terminate: the daemon died
        # by SIGABRT after logging run_finished. Everything is written by now: leave. Only
        # where a rendezvous ran: a caller's own threads (main() called in a process that
        # has some) are not a reason to end that process.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


