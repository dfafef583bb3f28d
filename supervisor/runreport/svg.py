"""The timeline as inline SVG: one lane per rank, its bars per generation coloured by
how the rank ended, fault markers, checkpoint marks, the time lost shaded, an axis
in seconds. Sizes are CSS pixels; ``plot_area`` says where the lanes land on the page."""

from __future__ import annotations

import html
import math

from supervisor.runreport.timeline import STATES, Bar, Mark, Span, Timeline

WIDTH = 1100  # the timeline's SVG, CSS pixels
LABELS = 80  # the lane labels' column
RIGHT = 16
TOP = 30  # generation labels, marks that belong to no rank
AXIS = 34
LOSS = 18  # a strip under the lanes: the time lost, by kind
PAGE_PAD = 16
HEADER = 56  # the title block's fixed height: the plot's place on the page is known

COLORS = {
    "succeeded": "#2e7d32",
    "failed": "#c62828",
    "hung": "#6a1b9a",
    "stopped": "#90a4ae",
    "running": "#1e88e5",
}
FAULT = "#ffab00"
FAULT_EDGE = "#3e2723"
CHECKPOINT = "#00897b"
STRAGGLER = "#8e24aa"  # a slow rank: not a fault, a different colour
SPANS = {
    "recomputation": ("#f8bbd0", "work done again since the last checkpoint"),
    "detection": ("#ffcc80", "failed, not yet noticed"),
    "restart": ("#b0bec5", "restarting: noticed until every rank steps again"),
    "between": ("#e0e0e0", "between daemon runs"),
}
STATE_TEXT = {
    "succeeded": "rank exited 0",
    "failed": "rank failed",
    "hung": "rank hung, then killed",
    "stopped": "rank stopped by the supervisor",
    "running": "running (no exit recorded)",
}


def lane_height(ranks: int) -> float:
    return max(3.0, min(28.0, 600.0 / max(1, ranks)))


def svg_height(t: Timeline) -> float:
    return TOP + lane_height(len(t.ranks)) * max(1, len(t.ranks)) + LOSS + AXIS


def plot_area(t: Timeline) -> tuple[int, int, int, int]:
    """Where the lanes are on the page (CSS pixels: left, top, right, bottom), for
    anyone who crops a screenshot of the page (the tests do)."""
    left, top = PAGE_PAD + LABELS, PAGE_PAD + HEADER + TOP
    height = lane_height(len(t.ranks)) * max(1, len(t.ranks))
    return left, top, PAGE_PAD + WIDTH - RIGHT, int(top + height)


def x_of(t: Timeline, seconds: float) -> float:
    return LABELS + (WIDTH - LABELS - RIGHT) * min(max(seconds / t.length, 0.0), 1.0)


def _tick_step(length: float) -> float:
    raw = length / 10
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _title(text: str) -> str:
    return f"<title>{_e(text)}</title>"


def timeline_svg(t: Timeline) -> str:
    lane = lane_height(len(t.ranks))
    height = svg_height(t)
    bottom = TOP + lane * max(1, len(t.ranks))
    row = {rank: TOP + i * lane for i, rank in enumerate(t.ranks)}
    out = [
        f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" role="img" aria-label="timeline of the ranks">',
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#b0bec5" '
        'stroke-width="1.5"/></pattern></defs>',
    ]
    for rank, y in row.items():
        out.append(
            f'<rect class="lane" x="{LABELS}" y="{y + 1:.1f}" width="{WIDTH - LABELS - RIGHT}" '
            f'height="{max(1.0, lane - 2):.1f}"/>'
        )
        if lane >= 11 or rank % max(1, round(12 / lane)) == 0:
            out.append(
                f'<text x="{LABELS - 8}" y="{y + lane / 2 + 4:.1f}" text-anchor="end">rank {rank}</text>'
            )
    out += [_span(t, s, bottom) for s in t.spans]
    out += _loss_strip(t, bottom)
    out += [_bar(t, b, row[b.rank], lane, _stepped_session(t, b)) for b in t.bars if b.rank in row]
    out += _generations(t, bottom + LOSS)
    out += [_checkpoint(t, m, row.get(m.rank) if m.rank is not None else None, lane) for m in _thinned(t)]
    out += [_fault(t, m, row.get(m.rank) if m.rank is not None else None, lane) for m in t.faults]
    out += _axis(t, bottom + LOSS)
    out.append("</svg>")
    return "\n".join(out)


def _thinned(t: Timeline) -> list[Mark]:
    """One checkpoint mark per pixel and lane: a long run saves thousands of times."""
    seen: set[tuple[int | None, str, int]] = set()
    out = []
    for m in t.checkpoints:
        key = (m.rank, m.kind, round(x_of(t, m.t)))
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


def _stepped_session(t: Timeline, bar: Bar) -> bool:
    return any(b.stepping is not None for b in t.bars if b.session == bar.session)


def _span(t: Timeline, s: Span, bottom: float) -> str:
    color, meaning = SPANS.get(s.kind, ("#eeeeee", s.kind))
    x0, x1 = x_of(t, s.start), x_of(t, s.end)
    w = max(1.0, x1 - x0)
    hatch = (
        f'<rect x="{x0:.1f}" y="{TOP}" width="{w:.1f}" height="{bottom - TOP:.1f}" fill="url(#hatch)"/>'
        if s.kind in ("restart", "between")
        else ""
    )
    return (
        f'<g class="span {s.kind}">{_title(f"{s.label} ({meaning})")}'
        f'<rect x="{x0:.1f}" y="{TOP}" width="{w:.1f}" height="{bottom - TOP:.1f}" fill="{color}" '
        'fill-opacity="0.3"/>'
        f"{hatch}</g>"
    )


def _loss_strip(t: Timeline, bottom: float) -> list[str]:
    """The spans again, solid, in a strip of their own: the bars hide the background."""
    out = [f'<text x="{LABELS - 8}" y="{bottom + LOSS / 2 + 4:.1f}" text-anchor="end">time lost</text>']
    for s in t.spans:
        color, meaning = SPANS.get(s.kind, ("#eeeeee", s.kind))
        x0, x1 = x_of(t, s.start), x_of(t, s.end)
        out.append(
            f'<g class="lost {s.kind}">{_title(f"{s.label} ({meaning})")}<rect x="{x0:.1f}" '
            f'y="{bottom + 3:.1f}" width="{max(1.0, x1 - x0):.1f}" height="{LOSS - 6}" fill="{color}"/></g>'
        )
    return out


def _bar(t: Timeline, b: Bar, y: float, lane: float, stepped: bool) -> str:
    color = COLORS.get(b.state, COLORS["stopped"])
    h = max(1.0, lane * 0.6)
    top = y + (lane - h) / 2
    x0, x1 = x_of(t, b.start), x_of(t, b.end)
    # before its first step a rank is starting up: drawn pale; never stepped: all pale
    ready = b.stepping if b.stepping is not None else (b.end if stepped else b.start)
    xs = min(max(x_of(t, ready), x0), x1)
    steps = f", stepping from +{b.stepping:.2f} s" if b.stepping is not None else ""
    tip = (
        f"rank {b.rank}, generation {b.generation}: +{b.start:.2f} s to +{b.end:.2f} s"
        f"{steps}; {STATE_TEXT.get(b.state, b.state)}"
    )
    parts = [f'<g class="bar {b.state}">{_title(tip)}']
    if xs > x0:
        parts.append(
            f'<rect x="{x0:.1f}" y="{top:.1f}" width="{xs - x0:.1f}" height="{h:.1f}" '
            f'fill="{color}" fill-opacity="0.35"/>'
        )
    if x1 > xs:
        parts.append(
            f'<rect x="{xs:.1f}" y="{top:.1f}" width="{max(1.0, x1 - xs):.1f}" height="{h:.1f}" '
            f'fill="{color}"/>'
        )
    parts.append("</g>")
    return "".join(parts)


def _fault(t: Timeline, m: Mark, y: float | None, lane: float) -> str:
    x = x_of(t, m.t)
    size = max(5.0, min(8.0, lane / 2))
    cy = (y + lane / 2) if y is not None else TOP - 9
    if m.kind.startswith("straggler"):  # a diamond: amber when flagged, hollow when cleared
        fill = STRAGGLER if m.kind == "straggler" else "#ffffff"
        pts = (f"{x:.1f},{cy - size:.1f} {x + size:.1f},{cy:.1f} {x:.1f},{cy + size:.1f} "
               f"{x - size:.1f},{cy:.1f}")  # fmt: skip
        return (f'<g class="fault {m.kind}">{_title(m.label)}<polygon points="{pts}" fill="{fill}" '
                f'stroke="{STRAGGLER}" stroke-width="1.5"/></g>')  # fmt: skip
    if m.kind == "hang":
        shape = f'<circle cx="{x:.1f}" cy="{cy:.1f}" r="{size:.1f}"'
    else:
        pts = f"{x - size:.1f},{cy - size:.1f} {x + size:.1f},{cy - size:.1f} {x:.1f},{cy + size:.1f}"
        shape = f'<polygon points="{pts}"'
    return (
        f'<g class="fault {m.kind}">{_title(m.label)}{shape} fill="{FAULT}" stroke="{FAULT_EDGE}" '
        f'stroke-width="1"/></g>'
    )


def _checkpoint(t: Timeline, m: Mark, y: float | None, lane: float) -> str:
    x = x_of(t, m.t)
    if m.kind == "synced" or y is None:
        s = 4.0
        return (
            f'<g class="checkpoint {m.kind}">{_title(m.label)}<rect x="{x - s:.1f}" y="{TOP - 13}" '
            f'width="{2 * s}" height="{2 * s}" fill="{CHECKPOINT}"/></g>'
        )
    r = max(2.0, min(4.0, lane / 5))
    fill = CHECKPOINT if m.kind == "saved" else "#ffffff"
    return (
        f'<g class="checkpoint {m.kind}">{_title(m.label)}'
        f'<line x1="{x:.1f}" y1="{y + 1:.1f}" x2="{x:.1f}" y2="{y + lane - 1:.1f}" stroke="{CHECKPOINT}"/>'
        f'<circle cx="{x:.1f}" cy="{y + 3 + r:.1f}" r="{r:.1f}" fill="{fill}" stroke="{CHECKPOINT}"/></g>'
    )


def _generations(t: Timeline, bottom: float) -> list[str]:
    out = []
    for at, label in t.generations:
        x = x_of(t, at)
        out.append(
            f'<line x1="{x:.1f}" y1="{TOP - 4}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="#546e7a" '
            f'stroke-dasharray="3,3"/><text x="{x + 3:.1f}" y="{TOP - 18}">{_e(label)}</text>'
        )
    return out


def _axis(t: Timeline, bottom: float) -> list[str]:
    out = [f'<line x1="{LABELS}" y1="{bottom:.1f}" x2="{WIDTH - RIGHT}" y2="{bottom:.1f}" stroke="#546e7a"/>']
    step = _tick_step(t.length)
    n = 0
    while n * step <= t.length + 1e-9:
        x = x_of(t, n * step)
        value = f"{n * step:g}"
        out.append(
            f'<line x1="{x:.1f}" y1="{bottom:.1f}" x2="{x:.1f}" y2="{bottom + 4:.1f}" stroke="#546e7a"/>'
            f'<text x="{x:.1f}" y="{bottom + 16:.1f}" text-anchor="middle">{value}</text>'
        )
        n += 1
    out.append(
        f'<text x="{WIDTH - RIGHT}" y="{bottom + 30:.1f}" text-anchor="end">'
        "seconds since the run started</text>"
    )
    return out


def _swatch(svg: str, text: str) -> str:
    return f'<span><svg width="22" height="14" viewBox="0 0 22 14">{svg}</svg>{_e(text)}</span>'


def legend() -> str:
    items = [
        _swatch(f'<rect x="1" y="3" width="20" height="8" fill="{COLORS[s]}"/>', STATE_TEXT[s])
        for s in STATES
    ]
    items.append(
        _swatch(
            f'<rect x="1" y="3" width="20" height="8" fill="{COLORS["succeeded"]}" fill-opacity="0.35"/>',
            "starting up (before its first step)",
        )
    )
    for kind, (color, meaning) in SPANS.items():
        hatch = (
            '<rect x="0" y="0" width="22" height="14" fill="url(#hatch)"/>'
            if kind in ("restart", "between")
            else ""
        )
        items.append(_swatch(f'<rect x="0" y="0" width="22" height="14" fill="{color}"/>{hatch}', meaning))
    items.append(_swatch(f'<polygon points="5,2 17,2 11,12" fill="{FAULT}" stroke="{FAULT_EDGE}"/>', "crash"))
    items.append(_swatch(f'<circle cx="11" cy="7" r="5" fill="{FAULT}" stroke="{FAULT_EDGE}"/>', "hang"))
    diamond = '<polygon points="11,1 17,7 11,13 5,7"'
    items.append(_swatch(f'{diamond} fill="{STRAGGLER}"/>', "straggler flagged"))
    items.append(_swatch(f'{diamond} fill="#fff" stroke="{STRAGGLER}"/>', "straggler cleared"))
    items.append(_swatch(f'<circle cx="11" cy="7" r="4" fill="{CHECKPOINT}"/>', "checkpoint saved"))
    items.append(
        _swatch(f'<circle cx="11" cy="7" r="4" fill="#fff" stroke="{CHECKPOINT}"/>', "checkpoint loaded")
    )
    items.append(
        _swatch(f'<rect x="7" y="3" width="8" height="8" fill="{CHECKPOINT}"/>', "checkpoint synced")
    )
    return '<div class="legend">' + "".join(items) + "</div>"
