"""What the timeline plot shows, as values: one lane per rank, bars, marks and spans.

Built from the sessions' events and their ledgers' incidents; times are seconds
since the first event, so the page and the tests read the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.catalogue.checkpoints import CheckpointReported, CheckpointSynced
from supervisor.core.catalogue.generation import GenerationEnded, GenerationStarted, RestartRequested
from supervisor.core.catalogue.job import PeerNews
from supervisor.core.catalogue.ranks import (
    RankExited,
    RankHung,
    RankSpawned,
    RankStepping,
    StragglerCleared,
    StragglerDetected,
    WorkloadRequest,
)
from supervisor.core.goodput import Incident
from supervisor.runreport.reader import Session

# how a rank's bar in a generation ended
STATES = ("succeeded", "failed", "hung", "stopped", "running")


@dataclass(frozen=True, slots=True)
class Bar:
    rank: int
    session: int
    generation: int
    start: float
    stepping: float | None  # its first step; before it, the bar is the rank starting up
    end: float
    state: str  # one of STATES


@dataclass(frozen=True, slots=True)
class Mark:
    t: float
    rank: int | None  # None: not a rank's (a peer's news, a synced checkpoint)
    kind: str  # crash, hang, peer, operator, request, straggler(_cleared); saved, loaded, synced
    label: str


@dataclass(frozen=True, slots=True)
class Span:
    start: float
    end: float
    kind: str  # recomputation, detection, restart, between (daemon runs)
    label: str


@dataclass(slots=True)
class Timeline:
    origin: float  # t_wall of the first event: 0 on the axis
    length: float
    ranks: list[int] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    faults: list[Mark] = field(default_factory=list)
    checkpoints: list[Mark] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    generations: list[tuple[float, str]] = field(default_factory=list)  # where each starts


def _num(e: Mapping[str, Any], key: str) -> float | None:
    v = e.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _int(e: Mapping[str, Any], key: str) -> int | None:
    v = e.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class _RunBars:
    """The bars of one daemon run: per generation and rank, from spawn to exit. Each
    node's own, since a node may spawn ranks before the rendezvous places it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.started: dict[int, float] = {}
        self.ended: dict[int, float] = {}
        self.spawned: dict[tuple[int, int], float] = {}
        self.stepping: dict[tuple[int, int], float] = {}
        self.exits: dict[tuple[int, int], tuple[float, str]] = {}
        self.hung: set[tuple[int, int]] = set()

    def add(self, e: Mapping[str, Any], t: float) -> None:
        name, gen, rank = e["event"], _int(e, "generation"), _int(e, "rank")
        if name == GenerationStarted.NAME and gen is not None and gen not in self.started:
            self.started[gen] = t
        elif name == GenerationEnded.NAME and gen is not None:
            self.ended[gen] = max(t, self.ended.get(gen, t))
        elif gen is None or rank is None:
            return
        elif name == RankSpawned.NAME:
            self.spawned.setdefault((gen, rank), t)
        elif name == RankStepping.NAME:
            self.stepping.setdefault((gen, rank), t)
        elif name == RankExited.NAME and (e.get("standby") or gen not in self.started):
            self.spawned.pop((gen, rank), None)  # dropped before its generation began
        elif name == RankExited.NAME:
            self.exits[(gen, rank)] = (t, str(e.get("state") or "stopped"))
        elif name == RankHung.NAME:
            self.hung.add((gen, rank))

    def bars(self, end: float) -> list[Bar]:
        out = []
        for gen, rank in sorted(self.spawned.keys() | self.exits.keys()):
            if gen not in self.started:
                continue  # a standby for a generation that never came
            start = max(self.started[gen], self.spawned.get((gen, rank), self.started[gen]))
            t_exit, state = self.exits.get((gen, rank), (self.ended.get(gen, end), "running"))
            if (gen, rank) in self.hung:
                state = "hung"
            elif state not in STATES:
                state = "stopped"  # unkillable, stopping: the daemon ended it
            stepping = self.stepping.get((gen, rank))
            out.append(Bar(rank, self.index, gen, start, stepping, max(start, t_exit), state))
        return out


def _fault(e: Mapping[str, Any], t: float) -> Mark | None:
    name, rank = e["event"], _int(e, "rank")
    gen = e.get("generation")
    if name == RankExited.NAME and e.get("state") == "failed" and not e.get("standby"):
        how = f"signal {e['signal']}" if e.get("signal") else f"exit code {e.get('exit_code')}"
        return Mark(t, rank, "crash", f"gen {gen}: rank {rank} failed ({how})")
    if name == RankHung.NAME:
        what = e.get("section") or e.get("kind") or "?"
        return Mark(t, rank, "hang", f"gen {gen}: rank {rank} hung ({what}, {e.get('open_for')} s silent)")
    if name == PeerNews.NAME:
        return Mark(t, None, "peer", f"gen {gen}: {e.get('news')} {e.get('detail') or ''}".strip())
    if name == RestartRequested.NAME:
        return Mark(t, None, "operator", f"gen {gen}: restart requested by an operator")
    if name == WorkloadRequest.NAME and e.get("action") not in (None, "continue"):
        return Mark(t, rank, "request", f"gen {gen}: rank {rank} asked to {e.get('action')}")
    return None


def _straggler(e: Mapping[str, Any], t: float) -> Mark | None:
    name, rank, gen = e["event"], _int(e, "rank"), e.get("generation")
    if name not in (StragglerDetected.NAME, StragglerCleared.NAME):
        return None
    kind = "straggler" if name == StragglerDetected.NAME else StragglerCleared.NAME
    what = "straggles" if kind == "straggler" else "no longer straggles"
    said = f"score {e.get('score')}, {e.get('window')} steps"
    return Mark(t, rank, kind, f"gen {gen}: rank {rank} {what} ({said})")


def _checkpoint(e: Mapping[str, Any], t: float) -> Mark | None:
    if e["event"] == CheckpointReported.NAME:
        kind = "loaded" if e.get("checkpoint") == "loaded" else "saved"
        it = e.get("iteration")
        at = f" at iteration {it}" if it is not None else ""
        return Mark(t, _int(e, "rank"), kind, f"rank {e.get('rank')} {kind} a checkpoint{at}")
    if e["event"] == CheckpointSynced.NAME:
        size = _num(e, "bytes")
        what = f"{size / 1e6:.1f} MB" if size is not None else "a checkpoint"
        dest = f" to {e['dest']}" if e.get("dest") else ""
        return Mark(t, _int(e, "rank"), "synced", f"synced {what}{dest}")
    return None


def build(sessions: list[Session], incidents: list[Incident], ended_at: float | None) -> Timeline:
    origin = sessions[0].start
    end = max(s.end for s in sessions)
    if ended_at is not None:
        end = max(end, ended_at)
    out = Timeline(origin=origin, length=max(end - origin, 1e-3))
    ranks: set[int] = set()
    for index, session in enumerate(sessions):
        labelled: set[int] = set()
        for e in session.events:
            t = float(e["t_wall"]) - origin
            gen = _int(e, "generation")
            if e["event"] == GenerationStarted.NAME and gen is not None and gen not in labelled:
                labelled.add(gen)  # where the first node started it
                out.generations.append((t, f"gen {gen}" if index == 0 else f"run {index + 1} gen {gen}"))
            fault = _fault(e, t) or _straggler(e, t)
            if fault is not None:
                out.faults.append(fault)
            mark = _checkpoint(e, t)
            if mark is not None:
                out.checkpoints.append(mark)
        for run in session.runs:
            bars = _RunBars(index)
            for e in run.events:
                bars.add(e, float(e["t_wall"]) - origin)
            out.bars += bars.bars(session.end - origin)
        ranks |= {b.rank for b in out.bars}
        if index > 0:
            gap = (sessions[index - 1].end - origin, session.start - origin)
            out.spans.append(Span(*gap, "between", "between daemon runs"))
    out.spans += _losses(incidents, origin)
    out.ranks = sorted(ranks | {m.rank for m in (*out.faults, *out.checkpoints) if m.rank is not None})
    return out


def _losses(incidents: list[Incident], origin: float) -> list[Span]:
    """Each incident's time lost, as spans: recomputation, detection, restart."""
    out: list[Span] = []
    for i in incidents:
        failed = i.failed_at - origin
        if i.recomputation > 0:
            label = f"gen {i.generation}: {i.recomputation:.2f} s to compute again"
            out.append(Span(failed - i.recomputation, failed, "recomputation", label))
        if i.detection > 0:
            label = f"gen {i.generation}: {i.detection:.2f} s to notice"
            out.append(Span(failed, failed + i.detection, "detection", label))
        if i.restart is not None and i.restart > 0:
            noticed = i.noticed_at - origin
            label = f"gen {i.generation}: {i.restart:.2f} s to restart"
            out.append(Span(noticed, noticed + i.restart, "restart", label))
    return out
