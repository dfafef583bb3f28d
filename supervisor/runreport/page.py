"""The report as one self-contained HTML page: inline CSS and SVG, no script, no fonts
or anything else fetched from the network, so it opens anywhere (a browser, a CI
artifact viewer) and looks the same."""

from __future__ import annotations

import html
import time

from supervisor.core.goodput import Incident, Summary
from supervisor.runreport.svg import HEADER, LABELS, PAGE_PAD, legend, timeline_svg
from supervisor.runreport.timeline import Timeline

CSS = """
body { margin: 0; padding: %(pad)dpx; font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif;
       color: #263238; background: #fff; }
header { height: %(header)dpx; overflow: hidden; }
h1 { font-size: 18px; margin: 0 0 4px; }
h2 { font-size: 15px; margin: 20px 0 6px; }
.sub { color: #607d8b; margin: 0; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
svg text { font: 11px system-ui, sans-serif; fill: #37474f; }
svg .lane { fill: #fafafa; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; margin: 6px 0 0 %(labels)dpx; }
.legend span { white-space: nowrap; }
.legend svg { vertical-align: middle; margin-right: 4px; }
table { border-collapse: collapse; }
td, th { padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
th { color: #607d8b; font-weight: 600; border-bottom: 1px solid #cfd8dc; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.detail { color: #607d8b; max-width: 520px; }
.good { font-size: 22px; font-weight: 600; }
.warn { color: #b71c1c; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole > 0 else "-"


PRODUCTIVE, RUNNING = "productive", "ranks running (steps unknown: start-up included)"
NO_STEPS = ("The ranks report no steps (supervisor.client reports them): restarts are measured to every "
            "rank started, and when they were training again is unknown.")  # fmt: skip


def summary_table(s: Summary) -> str:
    rows = [
        ("wall time", _s(s.wall), ""),
        (PRODUCTIVE if s.steps_known else RUNNING, _s(s.productive), _share(s.productive, s.wall)),
        ("lost to detection", _s(s.detection), _share(s.detection, s.wall)),
        ("lost to restarts", _s(s.restart), _share(s.restart, s.wall)),
        ("lost to recomputation", _s(s.recomputation), _share(s.recomputation, s.wall)),
        ("other overhead (start-up, shutdown)", _s(s.overhead), _share(s.overhead, s.wall)),
    ]
    body = "".join(
        f'<tr><td>{_e(a)}</td><td class="n">{b}</td><td class="n">{c}</td></tr>' for a, b, c in rows
    )
    return f"<table>{body}</table>"


def incidents_table(incidents: list[tuple[int, Incident]], origin: float, several: bool) -> str:
    if not incidents:
        return "<p>No incidents: no generation ended in a failure.</p>"
    head = (
        "run " if several else ""
    ) + "gen|failed at|first sign|cause|action|detection|restart|recomputation|iterations lost"
    cols = [c.strip() for c in head.split("|")]
    rows = ["<tr>" + "".join(f"<th>{_e(c)}</th>" for c in cols if c) + "</tr>"]
    for session, i in incidents:
        cause = " ".join(
            str(p)
            for p in (
                i.reason,
                f"[{i.rule}]" if i.rule else None,
                f"rank {i.rank}" if i.rank is not None else None,
                f"on node {i.node} (job blame: {i.blame})" if i.node is not None else None,
            )
            if p
        )
        cells = [
            *([str(session + 1)] if several else []),
            str(i.generation),
            f"+{i.failed_at - origin:.2f} s",
            i.sign,
            cause,
            i.action or "-",
            _s(i.detection),
            _s(i.restart),
            _s(i.recomputation),
            "-" if i.iterations_lost is None else str(i.iterations_lost),
        ]
        rows.append(
            "<tr>"
            + "".join(
                f'<td class="n">{_e(c)}</td>' if c[:1] in "+0123456789-" else f"<td>{_e(c)}</td>"
                for c in cells
            )
            + "</tr>"
        )
        if i.detail:
            rows.append(f'<tr><td colspan="{len(cells)}" class="detail">{_e(i.detail)}</td></tr>')
    return "<table>" + "".join(rows) + "</table>"


def render(
    *,
    title: str,
    read: list[str],
    warnings: list[str],
    summary: Summary,
    incidents: list[tuple[int, Incident]],
    sessions: int,
    timeline: Timeline,
    advice: str | None = None,
) -> str:
    wall = summary.wall
    goodput = "unknown" if summary.goodput is None else f"{100 * summary.goodput:.1f} %"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timeline.origin))
    state = "" if summary.finished else " (still running, or its daemon died: no run_finished)"
    facts = (
        f"{summary.generations} generation(s), {summary.restarts} restart(s), "
        f"{summary.checkpoints} checkpoint report(s)"
        + ("" if summary.last_iteration is None else f", last iteration {summary.last_iteration}")
    )
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{_e(title)}</title>",
            f"<style>{CSS % {'pad': PAGE_PAD, 'header': HEADER, 'labels': LABELS}}</style>",
            "</head><body>",
            f'<header><h1>{_e(title)}</h1><p class="sub">started {_e(when)}, {wall:.2f} s of wall '
            f"time{_e(state)}; goodput {goodput}</p></header>",
            timeline_svg(timeline),
            legend(),
            "<h2>Where the time went</h2>",
            f'<p><span class="good">{goodput}</span> goodput &middot; {_e(facts)}</p>',
            *([] if summary.steps_known else [f"<p>{_e(NO_STEPS)}</p>"]),
            summary_table(summary),
            *([f"<p>{_e(advice)}</p>"] if advice else []),
            "<h2>Incidents</h2>",
            incidents_table(incidents, timeline.origin, several=sessions > 1),
            "<h2>What was read</h2>",
            "<ul>" + "".join(f"<li>{_e(r)}</li>" for r in read) + "</ul>",
            *(
                [f'<ul class="warn">{"".join(f"<li>{_e(w)}</li>" for w in warnings)}</ul>']
                if warnings
                else []
            ),
            "</body></html>",
        ]
    )
