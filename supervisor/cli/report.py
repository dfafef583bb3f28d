"""``ft-supervisor report RUN_DIR``: where a run's time went, as text and as a page.

Reads the event logs of a daemon run (or of every daemon run of a run id: its
nodes, its resumptions), accounts for the wall time with
``supervisor.core.goodput`` (productive; lost to detection, restarts and
recomputation; overhead), prints the summary and writes a self-contained HTML
page with a timeline of the ranks, faults, restarts and checkpoints
(``RUN_DIR/report.html`` unless ``--html`` says otherwise).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from supervisor.config.errors import ConfigError

EXIT_OK = 0
EXIT_USAGE = 2


def add_commands(sub: Any) -> None:
    summary = "summarise a run: wall time, time lost per incident, goodput; and an HTML timeline"
    p = sub.add_parser("report", help=summary, description=summary)
    p.add_argument("run_dir", type=Path, help="a daemon run's directory, or a run id's (all its daemon runs)")
    p.add_argument("--html", type=Path, default=None, help="where to write the page (RUN_DIR/report.html)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=_report)


def _report(ns: argparse.Namespace) -> int:
    # imported here: `ft-supervisor run` never pays for the report's modules
    from supervisor.core.checkpoint_interval import describe  # noqa: PLC0415
    from supervisor.runreport import page  # noqa: PLC0415
    from supervisor.runreport.summary import build, text  # noqa: PLC0415

    try:
        report = build(ns.run_dir)
        target = ns.html if ns.html is not None else ns.run_dir / "report.html"
        title = f"ft-supervisor run {_run_id(report.sessions[0].events) or ns.run_dir.name}"
        content = page.render(
            title=title,
            read=report.read(),
            warnings=report.warnings(),
            summary=report.total,
            incidents=report.incidents,
            sessions=len(report.sessions),
            timeline=report.timeline,
            advice=None if report.advice is None else describe(report.advice),
        )
        _write(target, content)
    except ConfigError as exc:
        print(f"ft-supervisor report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if ns.json:
        out = {**report.to_json(), "html": str(target)}
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    else:
        print(text(report, target))
    return EXIT_OK


def _run_id(events: list[dict[str, Any]]) -> str | None:
    found = next((e.get("run_id") for e in events if isinstance(e.get("run_id"), str)), None)
    return str(found) if found is not None else None


def _write(path: Path, content: str) -> None:
    """Whole or not at all: a reader never sees half a page."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(content, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
