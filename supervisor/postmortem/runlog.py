"""A run directory's event log, read back into what each generation was.

One pass over ``events.jsonl``, one line at a time (a daemon killed mid-write
leaves a partial last line: skipped); only the events a judgement depends on
are kept, per generation. Standby ranks are kept apart: a generation's standbys
are spawned while the previous one runs, and the ones still waiting when the
run ends are stopped then; they never failed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from supervisor.core.catalogue import decode
from supervisor.core.catalogue.checkpoints import CheckpointReported
from supervisor.core.catalogue.daemon import RunFinished, RunStarted, StopRequested
from supervisor.core.catalogue.generation import (
    Decision,
    GenerationEnded,
    GenerationStarted,
    KernelLines,
    PluginsLoaded,
)
from supervisor.core.catalogue.job import JobBlame, JobDecision
from supervisor.core.catalogue.ranks import (
    DeadlineMissed,
    ExceptionReported,
    RankConnected,
    RankExited,
    RankFailureReported,
    RankHung,
    RankSpawned,
    RankStepping,
    RankUnkillable,
    WorkloadRequest,
)
from supervisor.core.policy import Policy

KERNEL_LINES = 200  # as many as the daemon gives one failure
EVENTS = "events.jsonl"
LINE_LIMIT = 16 << 20  # an event line is small; a stacks_dumped one can be long, never this long

Event = dict[str, Any]


@dataclass
class GenerationLog:
    """What the events say of one generation on this node."""

    number: int
    started: bool = False
    local_of: dict[int, int] = field(default_factory=dict)  # rank -> local rank
    exits: dict[int, Event] = field(default_factory=dict)  # local rank -> its last rank_exited
    hangs: dict[int, Event] = field(default_factory=dict)  # local rank -> its first rank_hung
    deadline: Event | None = None  # the first deadline_missed: what the hangs were named after
    connected: set[int] = field(default_factory=set)  # ranks whose client said hello
    stepping: set[int] = field(default_factory=set)  # ranks that completed a step
    saved: bool = False
    requests: list[Event] = field(default_factory=list)
    unkillable: tuple[int, ...] = ()
    iteration: int | None = None
    ended: Event | None = None
    decisions: list[Event] = field(default_factory=list)
    job_decision: Event | None = None
    job_blame: Event | None = None  # a job-wide hang's verdict (a desync's stands for the decision)
    multi: bool = False  # a rendezvous round: several nodes
    node_rank: int | None = None  # this node's in the job's round (None: one node)
    dmesg: tuple[str, ...] = ()  # the kernel's lines the daemon judged with
    reported: dict[int, float] = field(default_factory=dict)  # rank -> when it first reported its failure

    def local(self, rank: int) -> int:
        return self.local_of.get(rank, rank)

    @property
    def deadline_wall(self) -> float | None:
        """When (wall clock) the deadline the hangs were declared after was missed: one
        instant for every rank named hung, as the daemon records it."""
        found = [e for e in (self.deadline, *self.hangs.values()) if e is not None]
        return min((float(e["t_wall"]) - float(e.get("late_by") or 0.0) for e in found), default=None)

    @property
    def stop_wall(self) -> float | None:
        """An upper bound of when the termination procedure began: the first exit it
        caused. An error file written before then was written on the rank's own."""
        stopped = [e["t_wall"] for e in self.exits.values() if e.get("state") == "stopped"]
        return min(stopped, default=None)


@dataclass
class RunLog:
    run_dir: Path
    started: Event | None = None
    plugins: Event | None = None
    generations: dict[int, GenerationLog] = field(default_factory=dict)
    decisions: list[Event] = field(default_factory=list)  # in order, across generations
    stop: Event | None = None  # stop_requested
    finished: Event | None = None  # run_finished
    skipped: int = 0  # lines that were not JSON objects

    def generation(self, number: int) -> GenerationLog:
        return self.generations.setdefault(number, GenerationLog(number))

    @property
    def max_restarts(self) -> int | None:
        value = None if self.started is None else self.started.get("max_restarts")
        return value if isinstance(value, int) else None

    @property
    def policy(self) -> Policy | None:
        """The run's policy, as its daemon recorded it (None: an older daemon did not)."""
        return None if self.started is None else Policy.from_json(self.started.get("policy"))

    @property
    def restart_window(self) -> float | None:
        value = None if self.started is None else self.started.get("restart_window")
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _events(path: Path) -> Iterator[Event]:
    with path.open("rb") as f:
        for line in f:
            if len(line) > LINE_LIMIT:
                continue
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict) and isinstance(event.get("event"), str):
                yield decode(event).as_dict()  # older daemons' lines, upgraded


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rank_event(g: GenerationLog, name: str, e: Event) -> None:
    rank = _int(e.get("rank"))
    local = _int(e.get("local_rank"))
    if name == RankSpawned.NAME and rank is not None:
        g.local_of[rank] = rank if local is None else local
    elif name == RankExited.NAME and not e.get("standby"):
        local = local if local is not None else rank
        if local is not None:
            g.exits[local] = e
    elif name == RankHung.NAME and rank is not None:
        g.hangs.setdefault(g.local(rank), e)
    elif name == RankConnected.NAME and rank is not None:
        g.connected.add(rank)
    elif name == RankStepping.NAME and rank is not None:
        g.stepping.add(rank)


# events of the run as a whole: the attribute that keeps each (the first one)
_RUN_EVENTS = {RunStarted.NAME: "started", PluginsLoaded.NAME: "plugins", StopRequested.NAME: "stop",
               RunFinished.NAME: "finished"}  # fmt: skip
_RANK_EVENTS = (RankSpawned.NAME, RankExited.NAME, RankHung.NAME, RankConnected.NAME, RankStepping.NAME)


def _generation_event(run: RunLog, g: GenerationLog, name: str, e: Event) -> None:
    if name in _RANK_EVENTS:
        _rank_event(g, name, e)
    elif name == DeadlineMissed.NAME:
        g.deadline = g.deadline or e
    elif name == GenerationStarted.NAME:
        g.started = True
        g.multi = _int(e.get("nnodes")) is not None
        g.node_rank = _int(e.get("node_rank")) if g.multi else None
    elif name == CheckpointReported.NAME and e.get("checkpoint") != "loaded":
        g.saved = True
    elif name == WorkloadRequest.NAME and e.get("action") != "continue":
        g.requests.append(e)
    elif name == RankUnkillable.NAME:
        g.unkillable = tuple(r for r in e.get("local_ranks") or () if isinstance(r, int))
    elif name == GenerationEnded.NAME:
        g.ended = e
        g.iteration = _int(e.get("iteration"))
    elif name == Decision.NAME:
        g.decisions.append(e)
        run.decisions.append(e)
    elif name == JobDecision.NAME:
        g.job_decision = e
    elif name == JobBlame.NAME:
        g.job_blame = g.job_blame or e
    elif name in (ExceptionReported.NAME, RankFailureReported.NAME) and _int(e.get("rank")) is not None:
        g.reported.setdefault(int(e["rank"]), float(e.get("t_wall") or 0.0))
    elif name == KernelLines.NAME and isinstance(e.get("lines"), list):
        g.dmesg = tuple(str(line) for line in e["lines"][:KERNEL_LINES])


def _add(run: RunLog, e: Event) -> None:
    name = e["event"]
    if name in _RUN_EVENTS and getattr(run, _RUN_EVENTS[name]) is None:
        setattr(run, _RUN_EVENTS[name], e)
    number = _int(e.get("generation"))
    if number is not None:
        _generation_event(run, run.generation(number), name, e)


def read_run(run_dir: Path) -> RunLog:
    """Raises OSError when the event log cannot be read."""
    run = RunLog(run_dir)
    for e in _events(run_dir / EVENTS):
        _add(run, e)
    return run


def run_dirs(path: Path) -> list[Path]:
    """The run directories at ``path``: itself, or the ones a run id's directory holds
    (one per daemon started with that id: each attempt of an auto-resumed job), oldest first."""
    if (path / EVENTS).is_file():
        return [path]
    return sorted((p.parent for p in path.glob(f"*/{EVENTS}")), key=_started)


def _started(run_dir: Path) -> tuple[str, float]:
    """Named <UTC stamp>-<host>-<pid>: the stamp sorts runs by the second they began,
    their first event's time within it."""
    try:
        with (run_dir / EVENTS).open("rb") as f:
            first = orjson.loads(f.readline(LINE_LIMIT))
        at = float(first.get("t_wall") or 0.0) if isinstance(first, dict) else 0.0
    except (OSError, ValueError, TypeError):
        at = 0.0
    return run_dir.name.split("-", 1)[0], at
