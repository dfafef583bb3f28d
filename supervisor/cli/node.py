"""``ft-supervisor node``: this node's health ledger across runs, and clearing it
once the node is repaired.

    ft-supervisor node                           the marks, and whether a quarantine holds
    ft-supervisor node --node-quarantine 3/24h   ... judged against this threshold
    ft-supervisor node --clear                   forget them (after a repair)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import orjson

from supervisor.clock import SYSTEM
from supervisor.config import health
from supervisor.config.errors import ConfigError
from supervisor.core.health import Ledger, quarantined

EXIT_OK = 0
EXIT_QUARANTINED = 3  # for scripts: `ft-supervisor node || drain-this-node`
EXIT_USAGE = 2


def add_commands(sub: Any) -> None:
    summary = "show or clear this node's health ledger (hardware-looking failures across runs)"
    p = sub.add_parser("node", help=summary, description=summary)
    health.add_options(p.add_argument_group("the ledger"))
    p.add_argument("--clear", action="store_true", help="forget every mark (the node was repaired)")
    p.add_argument("--json", action="store_true", help="print the ledger as JSON")
    p.set_defaults(handler=_node, command_parser=p)


def _node(ns: argparse.Namespace) -> int:
    from supervisor.runtime.records.health import read_ledger, write_ledger  # noqa: PLC0415

    try:
        cfg = health.from_namespace(ns, os.environ)
    except ConfigError as exc:
        ns.command_parser.error(str(exc))
    now = SYSTEM.wall()
    if ns.clear:
        try:
            write_ledger(cfg, Ledger())
        except OSError as exc:
            print(f"ft-supervisor node: cannot clear {cfg.ledger}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_USAGE
        print(f"cleared {cfg.ledger}")
        return EXIT_OK
    ledger, problem = read_ledger(cfg, now)
    if problem is not None:
        print(f"ft-supervisor node: {problem} (read as empty)", file=sys.stderr)
    refused = quarantined(ledger, cfg.quarantine, now)
    if ns.json:
        out = {"ledger": str(cfg.ledger), **ledger.to_json(),
               "quarantine": None if cfg.quarantine is None else str(cfg.quarantine),
               "quarantined": refused is not None,
               "detail": None if refused is None else refused.detail}  # fmt: skip
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    else:
        print(_text(ledger, str(cfg.ledger), now))
        if refused is not None:
            print(f"\nquarantined: {refused.detail}")
        elif cfg.quarantine is not None:
            print(f"\nnot quarantined (--node-quarantine {cfg.quarantine})")
    return EXIT_QUARANTINED if refused is not None else EXIT_OK


def _text(ledger: Ledger, path: str, now: float) -> str:
    lines = [f"node health ledger: {path}", f"marks: {len(ledger.marks)}"]
    for m in reversed(ledger.marks):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.at))
        ago = _ago(now - m.at)
        where = f"run {m.run_id}" + (f" generation {m.generation}" if m.generation is not None else "")
        lines.append(f"  {when} ({ago} ago)  {m.kind:<10}  {m.rule or '-':<6}  {where}: {m.detail}")
    return "\n".join(lines)


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{max(seconds, 0):.0f}s"
