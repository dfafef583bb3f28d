"""Replaying what the daemon judged in a run directory: the same evidence, the
same classifier chain, the same policy with the run's budget and history.

The daemon wrote a ``decision`` event for every generation that did not simply
succeed. For each one it judged itself (the reasons ``decide`` gives), the
evidence is rebuilt as ``supervisor.runtime.lifecycle.aftermath`` gathered it:

* the ranks that failed on their own (``rank_exited`` state ``failed``), the
  ranks it stopped whose error file was written before the termination began
  (the first exit it caused bounds that instant from above), and the ranks it
  declared hung (``rank_hung``, rebuilt into a ``Hang`` for the HANG rule);
  standbys (spawned for the next generation, stopped unused) never count;
* each rank's exit status, error file (parsed, with its mtime), the tail of its
  stderr read as the daemon reads it, and the trouble-looking lines of its
  stdout and stderr, bounded as the daemon's log follower bounds them;
* whether it completed a step (``rank_stepping``; ``rank_connected`` without one:
  it did not), workload requests, ranks that outlived SIGKILL, checkpoints saved,
  and the progress in iterations (``generation_ended``'s best iteration).

Not in the run directory, so not replayed: the exception a rank's client
reported (its traceback is in the rank's stderr, which is read), and the first
generation's spread of iterations across ranks (taken as one step of progress:
ranks step together).

Decisions the daemon did not judge (an operator's restart; a peer's failure,
a membership change, a lost node, the rendezvous: multi-node) are taken from
the event as they are: this node's files cannot say what another node saw. A
decision the job adopted keeps the classification this node made before it,
as the daemon's reason file does.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from supervisor.core.classify import Classification
from supervisor.core.errorfile import order_failures
from supervisor.core.evidence import Evidence, Part, WorkloadRequest, part_of, root_first
from supervisor.core.job_verdict import desync_decision
from supervisor.core.jobwide import FREE_REASONS, NodeOutcome, spends_budget
from supervisor.core.policy import Budget, History, Past, Policy, decide
from supervisor.core.types import Action, Decision, ExitStatus, RankExit, RankFailure, Reason
from supervisor.core.watch import Hang, HangKind
from supervisor.hooks import PluginSettings
from supervisor.hooks.registry import Registry
from supervisor.postmortem import logs
from supervisor.postmortem.runlog import Event, GenerationLog, RunLog, read_run
from supervisor.process.evidence import AFTER_LINES, read_error_file_now, read_tail
from supervisor.process.tail import NOTABLE_LINE_MAX, NOTABLE_LINES

# the reasons ``decide`` gives: a judgement of this node's own evidence
JUDGED = frozenset(
    {Reason.RANK_FAILED, Reason.RANK_HUNG, Reason.RESTARTS_EXHAUSTED, Reason.RANK_UNKILLABLE,
     Reason.WORKLOAD_REQUEST, Reason.NOT_RETRYABLE, Reason.CLASSIFIED, Reason.REPEATED,
     Reason.NO_PROGRESS}
)  # fmt: skip
# what the daemon classifies a generation with when it ended on workload requests alone
NOTHING = Classification("none", "request", "transient", Action.CONTINUE, summary="no failure")


@dataclass(frozen=True, slots=True)
class Settings:
    """Settings to judge a run with instead of its own: its rule files and disabled plugins
    (``plugins_loaded``), its policy, restart window and budget (``run_started``) are
    read from its event log where these are not given (None)."""

    rules: tuple[Mapping[str, Any], ...] = ()
    disabled: tuple[str, ...] | None = None
    policy: Policy | None = None  # None: the run's (the defaults for an older run's log)
    window: float | None = None  # None: the run's
    max_restarts: int | None = None  # None: the run's


@dataclass(frozen=True, slots=True)
class Judged:
    """One decision event, and what the replay made of it."""

    generation: int
    event: Event  # the daemon's decision event
    own: bool  # judged from this node's evidence (else taken from the event)
    evidence: Evidence | None
    classification: Classification | None
    decision: Decision


@dataclass(frozen=True, slots=True)
class ReplayedRun:
    """A run directory, judged again."""

    run_dir: Path
    outcome: str  # as reason.json's: succeeded | continue | stopped | restart | reschedule | abort | failed
    exit_code: int | None  # None: the daemon never finished (killed)
    judged: tuple[Judged, ...]
    final: Judged | None  # the decision the run ended on, when a failure ended it
    last_failure: Judged | None  # the last failure it went on after, when none ended it
    problems: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()  # plugins the run loaded that are not loaded here


def is_own(event: Event) -> bool:
    """Was this decision judged from this node's own evidence?"""
    try:
        reason = Reason(str(event.get("reason")))
    except ValueError:
        return False
    # a follower with no restart left is "restarts exhausted" too, with nothing classified
    return reason in JUDGED and (event.get("rule") is not None or reason is Reason.WORKLOAD_REQUEST)


_HANG_FIELDS = frozenset(f.name for f in fields(Hang))


def _hang(event: Event | None, deadline_wall: float | None) -> tuple[Hang | None, float | None]:
    """The hang a ``rank_hung`` event declared, and the wall-clock time of the missed
    deadline it was declared after (the same for every rank it named)."""
    if event is None:
        return None, None
    try:
        kind = HangKind(str(event.get("kind")))
    except ValueError:
        return None, None
    late_by = float(event.get("late_by") or 0.0)
    timeout = event.get("timeout")
    # what a daemon that blames a hang on the evidence says of it, where this Hang has room
    blamed: dict[str, Any] = {
        "deadline_rank": event.get("deadline_rank"),
        "evidence": f"{event['blamed_by']}: {event.get('evidence')}" if event.get("blamed_by") else "",
    }
    hang = Hang(
        rank=int(event["rank"]), kind=kind, section=event.get("section"),
        timeout=None if timeout is None else float(timeout),
        open_for=float(event.get("open_for") or 0.0), late_by=late_by,
        **{k: v for k, v in blamed.items() if k in _HANG_FIELDS},
    )  # fmt: skip
    return hang, deadline_wall if deadline_wall is not None else float(event["t_wall"]) - late_by


def _status(event: Event) -> ExitStatus:
    code, name = event.get("exit_code"), event.get("signal")
    if isinstance(name, str):
        known = signal.Signals.__members__.get(name)
        return ExitStatus(signal=int(known)) if known is not None else ExitStatus()
    return ExitStatus(code=code if isinstance(code, int) else None)


def _bytes(exited: Event, stream: str) -> int | None:
    value = exited.get(f"{stream}_bytes")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _notable(rank_dir: Path, exited: Event) -> tuple[str, ...]:
    """The trouble-looking lines of both of the rank's logs up to its exit (the event says
    how far they went), bounded as the daemon's follower bounds them: the first quarter,
    then the latest."""
    found: list[str] = []
    for stream in ("stdout", "stderr"):
        if (rank_dir / f"{stream}.log").is_file():
            lines = logs.scan(rank_dir / f"{stream}.log", end=_bytes(exited, stream))[0]
            found += [ln[:NOTABLE_LINE_MAX] for ln in lines]
    first = NOTABLE_LINES // 4
    return (*found[:first], *found[first:][-(NOTABLE_LINES - first) :])


def _after_exit(rank_dir: Path, exited: Event) -> tuple[str, ...]:
    """What reached the rank's stderr after it died (its leftover processes wrote it)."""
    start = _bytes(exited, "stderr")
    return read_tail(rank_dir / "stderr.log", max_lines=AFTER_LINES, start=start) if start else ()


def _failure(run: RunLog, g: GenerationLog, local: int, exited: Event) -> tuple[RankFailure, bool] | None:
    """The rank's failure, and whether it failed on its own (or hung); False: a rank we
    stopped that did not end cleanly (``Evidence.stopped``)."""
    state = exited.get("state")
    if state not in ("failed", "stopped"):
        return None
    rank = exited.get("rank")
    rank = rank if isinstance(rank, int) else local
    rank_dir = run.run_dir / f"gen_{g.number}" / f"local_rank_{local}"
    error, error_at = read_error_file_now(rank_dir / "error.json")
    hang, hang_at = _hang(g.hangs.get(local), g.deadline_wall)
    reported = g.reported.get(rank)
    first = reported is not None and (g.stop_wall is None or reported < g.stop_wall)
    part = part_of(str(state), exit_code=_status(exited).code, error_at=error_at, stop_wall=g.stop_wall,
                   hung=hang is not None, reported_first=first)  # fmt: skip
    if part is None or part is Part.BYSTANDER:
        return None
    pid = exited.get("pid")
    exit = RankExit(
        local, rank, pid if isinstance(pid, int) else 0, _status(exited),
        at=float(exited.get("t_mono") or 0.0), at_wall=float(exited.get("t_wall") or 0.0),
        terminated=state == "stopped",
    )  # fmt: skip
    progressed = True if rank in g.stepping else False if rank in g.connected else None
    return RankFailure(
        exit=exit, error=error, error_at=error_at,
        log_tail=read_tail(rank_dir / "stderr.log", end=_bytes(exited, "stderr")),
        hang=hang, hang_at=hang_at, notable=_notable(rank_dir, exited), progressed=progressed,
        after_exit=_after_exit(rank_dir, exited),
    ), part is Part.FAILED  # fmt: skip


def _progress(g: GenerationLog, best: int | None) -> tuple[int | None, int | None]:
    """(this generation's progress past the best before it, the new best), as the judge counts."""
    if g.iteration is None:
        return (None if best is None else 0), best
    if best is None:
        return 1, g.iteration  # the spread across ranks is not logged: ranks step together
    return g.iteration - best, max(best, g.iteration)


def evidence_of(run: RunLog, g: GenerationLog, progress: int | None) -> Evidence:
    seen = [f for local, e in sorted(g.exits.items()) if (f := _failure(run, g, local, e)) is not None]
    found = [f for f, failed in seen if failed]
    stopped = [f for f, failed in seen if not failed]
    requests = tuple(
        WorkloadRequest(int(e.get("rank") or 0), str(e.get("action")), str(e.get("reason") or ""))
        for e in g.requests
    )
    return Evidence(
        failures=tuple(order_failures(found)), stopped=tuple(order_failures(stopped)),
        unkillable=g.unkillable, requests=requests, generation=g.number, progress=progress, saved=g.saved,
        dmesg=g.dmesg,
    )  # fmt: skip


def _restarted(g: GenerationLog) -> bool:
    """Did the job restart after this generation, spending a restart of the budget?"""
    if g.job_decision is not None:
        if g.job_decision.get("action") != "restart":
            return False
        outcomes = []
        for raw in g.job_decision.get("outcomes") or ():
            try:
                outcomes.append(NodeOutcome.from_json(raw))
            except ValueError:
                continue
        return spends_budget(outcomes)
    last = g.decisions[-1] if g.decisions else None
    return (
        last is not None
        and last.get("action") == "restart"
        and str(last.get("reason")) not in {str(r) for r in FREE_REASONS}
    )


def _budget(run: RunLog, settings: Settings, number: int, event: Event) -> Budget:
    spent = [
        float(g.decisions[-1]["t_mono"])
        for n, g in sorted(run.generations.items())
        if n < number and g.decisions and _restarted(g)
    ]
    used = event.get("restarts_used")  # the daemon's count: the job's, on several nodes
    if isinstance(used, int) and used > len(spent):
        # a node that joined late took on the job's restarts: count them as early ones
        start = float((run.started or {}).get("t_mono") or 0.0)
        spent = [start] * (used - len(spent)) + spent
    elif isinstance(used, int) and 0 <= used < len(spent):
        spent = spent[len(spent) - used :]
    limit = settings.max_restarts if settings.max_restarts is not None else run.max_restarts or 0
    window = settings.window if settings.window is not None else run.restart_window
    return Budget(max(0, limit), window, tuple(spent))


@dataclass
class _Judge:
    """The daemon's judge, again: its history, its best iteration, its last judgement."""

    run: RunLog
    registry: Registry
    settings: Settings
    history: History = field(default_factory=History)
    best: int | None = None
    evidence: Evidence | None = None
    classification: Classification | None = None
    decision: Decision | None = None
    judged: set[int] = field(default_factory=set)

    def judge(self, event: Event) -> Judged:
        number = int(event["generation"])
        g = self.run.generation(number)
        now = float(event.get("t_mono") or 0.0)
        if is_own(event) and number not in self.judged:
            self.judged.add(number)
            progress, self.best = _progress(g, self.best)
            evidence = evidence_of(self.run, g, progress)
            budget = _budget(self.run, self.settings, number, event)
            policy = self.settings.policy or self.run.policy or Policy()
            c: Classification | None = None
            if evidence.failures or evidence.unkillable:
                c = self.registry.classify(evidence)
                decision = decide(evidence, c, self.history, budget, now, policy=policy)
                self.history = self.history.add(Past.of(evidence, c, now))
                evidence = root_first(evidence, c.rank)
            else:
                decision = decide(evidence, NOTHING, self.history, budget, now, policy=policy)
            # the job's blame found a desync: its abort stands for this node's judgement, as the daemon's
            decision = (desync_decision(g.job_blame) if g.job_blame else None) or decision
            self.evidence, self.classification, self.decision = evidence, c, decision
            return Judged(number, event, True, evidence, c, decision)
        decision = _taken(event)
        if event.get("rule") is None:  # followed a peer, or an operator: nothing classified
            self.evidence, self.classification = Evidence((), generation=number), None
        elif self.evidence is None:  # adopted: this node's judgement stands
            self.evidence = Evidence((), generation=number)
        self.decision = decision
        return Judged(number, event, False, self.evidence, self.classification, decision)


def _taken(event: Event) -> Decision:
    """A decision this node did not judge, as the event says it."""
    try:
        action = Action(str(event.get("action")))
    except ValueError:
        action = Action.RESTART  # a newer daemon's word: the run went on or ended as its exit says
    try:
        reason = Reason(str(event.get("reason")))
    except ValueError:
        reason = Reason.PEER_FAILED
    return Decision(action, reason, str(event.get("detail") or ""))


def _outcome(run: RunLog, decision: Decision | None) -> str:
    """The run's outcome, as the daemon's judge names it in the reason file."""
    code = None if run.finished is None else run.finished.get("exit_code")
    if run.stop is not None:
        return "stopped"
    if code == 0:
        return "continue" if decision is not None and decision.action is Action.CONTINUE else "succeeded"
    if decision is not None and decision.action is not Action.RESTART:
        return str(decision.action)
    return "failed" if run.finished is not None else "unfinished"


def replay(run: RunLog, registry: Registry, settings: Settings) -> ReplayedRun:
    judge = _Judge(run, registry, settings)
    judged = tuple(judge.judge(e) for e in run.decisions if isinstance(e.get("generation"), int))
    outcome = _outcome(run, judge.decision)
    last = None
    if judged and judge.decision is not None:
        # the judge's last word: a decision adopted from the job keeps the judgement before it
        number = judged[-1].generation if judge.evidence is None else judge.evidence.generation
        last = Judged(number, judged[-1].event, judged[-1].own, judge.evidence, judge.classification,
                      judge.decision)  # fmt: skip
    here = {p.name for p in registry.loaded}
    missing = tuple(str(p) for p in (run.plugins or {}).get("plugins") or () if p not in here)
    by_failure = outcome not in ("succeeded", "continue", "stopped", "unfinished")
    code = None if run.finished is None else run.finished.get("exit_code")
    return ReplayedRun(
        run_dir=run.run_dir,
        outcome=outcome,
        exit_code=code if isinstance(code, int) else None,
        judged=judged,
        final=last if by_failure else None,
        last_failure=last if not by_failure and last is not None and last.classification else None,
        problems=(f"the run loaded plugin(s) not loaded here: {', '.join(missing)}",) if missing else (),
        missing=missing,
    )


def registry_for(run: RunLog, settings: Settings) -> tuple[Registry, tuple[str, ...]]:
    """The classifier chain the run had: its rule files and disabled plugins, unless
    ``settings`` name others; and what could not be had."""
    from supervisor.config.errors import ConfigError  # noqa: PLC0415
    from supervisor.config.policy import user_rules  # noqa: PLC0415

    loaded = run.plugins or {}
    rules, notes = settings.rules, []
    files = [str(f) for f in loaded.get("rule_files") or ()]
    if not rules and files:
        try:
            rules = user_rules(files)
        except ConfigError as exc:
            notes.append(f"the run's rules cannot be read here: {exc}")
    disabled = settings.disabled if settings.disabled is not None else tuple(loaded.get("disabled") or ())
    registry = Registry(disabled=disabled)
    registry.configure(PluginSettings(rules=rules))
    return registry, tuple(notes)


def judge_run(run_dir: Path, settings: Settings | None = None) -> ReplayedRun:
    """Judge a run directory again. Raises OSError when its event log cannot be read."""
    settings = settings or Settings()
    run = read_run(run_dir)
    registry, notes = registry_for(run, settings)
    replayed = replay(run, registry, settings)
    failed = (f"plugin {p.plugin} ({p.stage}): {p.error}" for p in registry.problems)
    problems = (*notes, *replayed.problems, *failed)
    return replace(replayed, problems=tuple(dict.fromkeys(problems)))
