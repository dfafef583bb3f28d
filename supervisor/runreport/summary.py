"""A run's report: its sessions' ledgers, combined, and the text summary.

Several sessions (a run resumed after its daemons ended) are accounted one by
one and added up over the whole span, first event to last: the time between
them counts as the restart of the incident that ended the earlier session (it
asked to be rescheduled, say) up to the next session's first step, and as
overhead when no incident explains it (the run was stopped, its daemon died).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from supervisor.core import checkpoint_interval
from supervisor.core.catalogue.checkpoints import CheckpointIntervalAdvised
from supervisor.core.goodput import Incident, Ledger, Summary
from supervisor.runreport import reader, timeline
from supervisor.runreport.reader import DaemonRun, Session, Skipped


@dataclass(slots=True)
class Report:
    root: Path
    runs: list[DaemonRun]
    sessions: list[Session]
    summaries: list[Summary]  # one per session
    total: Summary  # all sessions, first event to last
    incidents: list[tuple[int, Incident]]  # (session index, incident)
    gaps: float  # seconds between sessions
    timeline: timeline.Timeline
    # the last checkpoint_interval_advised event (its fields): the advice the run ended with
    advice: dict[str, Any] | None = None

    @property
    def skipped(self) -> list[Skipped]:
        return [s for run in self.runs for s in run.skipped]

    def read(self) -> list[str]:
        """What was read, one line each."""
        out = []
        for index, session in enumerate(self.sessions):
            nodes = len({r.host for r in session.runs})
            what = f"{len(session.runs)} daemon run(s) on {nodes} host(s), merged by time"
            prefix = f"session {index + 1}: " if len(self.sessions) > 1 else ""
            out.append(prefix + (what if len(session.runs) > 1 else "1 daemon run"))
            for run in session.runs:
                pid = f", pid {run.pid}" if run.pid is not None else ""
                end = "" if run.finished else ", no run_finished (still running, or its daemon died)"
                out.append(
                    f"  {run.path / reader.EVENTS}: {len(run.events)} events, host {run.host}{pid}{end}"
                )
        empty = [r for r in self.runs if not r.events]
        out += [f"  {r.path / reader.EVENTS}: no events" for r in empty]
        return out

    def warnings(self) -> list[str]:
        skipped = self.skipped
        if not skipped:
            return []
        shown = ", ".join(f"{s.path.parent.name} line {s.line} ({s.why})" for s in skipped[:5])
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        return [f"skipped {len(skipped)} line(s) that are not events: {shown}{more}"]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.root),
            "summary": self.total.to_json(),
            "sessions": [
                {"daemon_runs": [str(r.path) for r in session.runs], "summary": s.to_json()}
                for session, s in zip(self.sessions, self.summaries, strict=True)
            ],
            "between_sessions": self.gaps,
            "checkpoint_interval": self.advice,
            "skipped": [{"path": str(s.path), "line": s.line, "why": s.why} for s in self.skipped],
        }


def ledger_of(events: list[dict[str, Any]]) -> Summary:
    ledger = Ledger()
    for e in events:
        ledger.add(e["event"], e)
    return ledger.summary()


def build(root: Path) -> Report:
    runs, sessions = reader.read(root)
    summaries = [ledger_of(s.events) for s in sessions]
    incidents = [(i, inc) for i, s in enumerate(summaries) for inc in s.incidents]
    total, incidents, gaps = _combine(sessions, summaries, incidents)
    plot = timeline.build(sessions, [i for _, i in incidents], total.ended_at)
    return Report(root, runs, sessions, summaries, total, incidents, gaps, plot, last_advice(sessions))


def last_advice(sessions: list[Session]) -> dict[str, Any] | None:
    """The last advised checkpoint interval told (any node), without the event's envelope."""
    told = [e for s in sessions for e in s.events if e["event"] == CheckpointIntervalAdvised.NAME]
    if not told:
        return None
    last = max(told, key=lambda e: float(e["t_wall"]))
    return {k: v for k, v in last.items() if k not in ("event", "run_id")}


def _combine(
    sessions: list[Session], summaries: list[Summary], incidents: list[tuple[int, Incident]]
) -> tuple[Summary, list[tuple[int, Incident]], float]:
    if len(summaries) == 1:
        return summaries[0], incidents, 0.0
    starts = [
        s.started_at if s.started_at is not None else sessions[i].start for i, s in enumerate(summaries)
    ]
    ends = [s.ended_at if s.ended_at is not None else sessions[i].end for i, s in enumerate(summaries)]
    gaps = sum(max(0.0, starts[i + 1] - ends[i]) for i in range(len(summaries) - 1))
    # the incident that ended a session waits for the next session's first step
    resumed: list[tuple[int, Incident]] = []
    for index, incident in incidents:
        last = incident is summaries[index].incidents[-1]
        if last and incident.restart is None and index + 1 < len(summaries):
            step = summaries[index + 1].stepping_at
            step = step if step is not None else starts[index + 1]
            resumed.append((index, replace(incident, restart=max(0.0, step - incident.noticed_at))))
        else:
            resumed.append((index, incident))
    wall = ends[-1] - starts[0]
    productive = sum(s.productive for s in summaries)
    detection = sum(i.detection for _, i in resumed)
    restart = sum(i.restart or 0.0 for _, i in resumed)
    recomputation = sum(i.recomputation for _, i in resumed)
    total = Summary(
        started_at=starts[0],
        ended_at=ends[-1],
        finished=summaries[-1].finished,
        wall=wall,
        productive=productive,
        detection=detection,
        restart=restart,
        recomputation=recomputation,
        restarts=sum(s.restarts for s in summaries) + len(summaries) - 1,
        generations=sum(s.generations for s in summaries),
        checkpoints=sum(s.checkpoints for s in summaries),
        last_iteration=max(
            (s.last_iteration for s in summaries if s.last_iteration is not None), default=None
        ),
        incidents=tuple(i for _, i in resumed),
        stepping_at=summaries[0].stepping_at,
        steps_known=any(s.steps_known for s in summaries),
    )
    return total, resumed, gaps


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f} %" if whole > 0 else "    -"


def text(report: Report, html_path: Path | None) -> str:
    s = report.total
    state = "" if s.finished else "  (not finished: still running, or its daemon died)"
    rows = [
        ("wall time", s.wall, None),
        ("productive" if s.steps_known else "ranks running", s.productive, s.wall),
        ("lost: detection", s.detection, s.wall),
        ("lost: restarts", s.restart, s.wall),
        ("lost: recomputation", s.recomputation, s.wall),
        ("other overhead", s.overhead, s.wall),
    ]
    out = [
        f"run report: {report.root}",
        *report.read(),
        *report.warnings(),
        "",
        (f"goodput {100 * s.goodput:.1f} %{state}" if s.goodput is not None else
         f"goodput unknown: the ranks report no steps, so their start-up cannot be told from training "
         f"(supervisor.client reports steps){state}"),
        *(
            f"  {name:<22}{_s(v):>12}  {_pct(v, whole) if whole is not None else ''}".rstrip()
            for name, v, whole in rows
        ),
    ]
    if report.gaps:
        out.append(f"  {'between daemon runs':<22}{_s(report.gaps):>12}  (within the above)")
    iteration = "" if s.last_iteration is None else f", last iteration {s.last_iteration}"
    out.append(
        f"  {s.generations} generation(s), {s.restarts} restart(s), "
        f"{s.checkpoints} checkpoint report(s){iteration}"
    )
    if report.advice is not None:
        out.append("  " + checkpoint_interval.describe(report.advice))
    out += ["", _incidents_text(report)]
    if html_path is not None:
        out += ["", f"html: {html_path}"]
    return "\n".join(out)


# the incident table's columns: title, and whether figures align right
_COLUMNS = (
    ("gen", False), ("failed at", False), ("rank", False), ("first sign", False), ("action", False),
    ("detection", True), ("restart", True), ("recompute", True), ("iters", True),
)  # fmt: skip


def _table(rows: list[list[str]], titles: tuple[tuple[str, bool], ...]) -> list[str]:
    """Rows under their titles, each column as wide as its widest cell."""
    widths = [max(len(title), *(len(r[c]) for r in rows)) for c, (title, _) in enumerate(titles)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.rjust(w) if right else cell.ljust(w)
            for cell, w, (_, right) in zip(cells, widths, titles, strict=True)
        ).rstrip()

    return [line([title for title, _ in titles]), *(line(r) for r in rows)]


def _incidents_text(report: Report) -> str:
    if not report.incidents:
        return "incidents: none (no generation ended in a failure)"
    several = len(report.sessions) > 1
    origin = report.timeline.origin
    titles = ((("run", False),) if several else ()) + _COLUMNS
    rows, notes = [], []
    for index, i in report.incidents:
        rows.append([
            *([str(index + 1)] if several else []),
            str(i.generation),
            f"+{i.failed_at - origin:.2f} s",
            "-" if i.rank is None else str(i.rank) + ("" if i.node is None else f" (node {i.node})"),
            i.sign,
            i.action or "-",
            _s(i.detection).strip(),
            _s(i.restart).strip(),
            _s(i.recomputation).strip(),
            "-" if i.iterations_lost is None else str(i.iterations_lost),
        ])  # fmt: skip
        cause = f"{i.reason or 'no decision'}" + (f" [{i.rule}]" if i.rule else "")
        note = [f"{cause}: {i.detail}" if i.detail else cause]
        if i.blame is not None:  # the same culprit on every node's report
            note.append(f"the job blamed rank {i.rank} on node {i.node} ({i.blame})")
        if i.restart is not None:
            # the figure a user cares about: the failure to every rank of the next generation stepping
            who = "a rank" if i.rank is None else f"rank {i.rank}"
            again = "stepping again" if report.total.steps_known else "started again"
            note.append(
                f"{who} failed; every rank was {again} {_s(i.detection + i.restart).strip()} "
                f"later (noticed after {_s(i.detection).strip()}, restart {_s(i.restart).strip()})"
            )
            if not report.total.steps_known:
                note.append("when they were stepping again is unknown: the ranks report no steps")
        notes.append(note)
    head, *lines = _table(rows, titles)
    out = [f"incidents: {len(report.incidents)}", "  " + head]
    for line, note in zip(lines, notes, strict=True):
        out += ["  " + line, *("       " + n for n in note)]
    return "\n".join(out)
