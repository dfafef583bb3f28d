"""From an ended generation to this node's decision, as stages that return values.

evidence (``evidence_of``: the ranks' error files and log tails, read once)
-> classification (the classifier plugins) -> decision (``core.policy.decide``)
make one ``Judgement``. A generation that simply succeeded has none; one ended by
an operator's restart, a peer's news or a decision taken while its ranks ran is
decided without this node's evidence (``core.next_step``). What the node
remembers from one generation to the next (its restart budget, the failures the
policy escalates from, the best iteration reached) is ``Memory``: every stage
that changes it returns a new one.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from supervisor.config.run import RunConfig
from supervisor.core.catalogue import generation as ev
from supervisor.core.catalogue.generation import PluginFailed, PluginsLoaded
from supervisor.core.classify import Classification
from supervisor.core.errorfile import order_failures
from supervisor.core.evidence import Evidence, Part, part_of, root_first
from supervisor.core.next_step import Basis, GenerationEnd, basis_of, without_evidence
from supervisor.core.policy import Budget, History, Past, Policy, decide
from supervisor.core.states import GroupResult, RankState
from supervisor.core.types import Action, Decision, RankFailure
from supervisor.hooks import PluginSettings
from supervisor.hooks.registry import Problem, Registry
from supervisor.process.evidence import failure_evidence
from supervisor.runtime.lifecycle.ended import GenerationEnded
from supervisor.runtime.records.events import EventLog

# a generation that ended on a workload request alone: nothing to classify
NOTHING = Classification("none", "request", "transient", Action.CONTINUE, summary="no failure")
NODE = socket.gethostname()


@dataclass(frozen=True, slots=True)
class Memory:
    """What this node carries from one generation to the next."""

    budget: Budget
    history: History = field(default_factory=History)
    best_iteration: int | None = None

    def remaining(self, now: float) -> int:
        return self.budget.remaining(now)

    def spent(self, now: float) -> Memory:
        """A restart the job pays for."""
        return replace(self, budget=self.budget.spend(now))


@dataclass(frozen=True, slots=True)
class Judgement:
    """A decision and what it rests on: what ``reason.json`` and the ``decision`` event say."""

    evidence: Evidence
    classification: Classification | None
    decision: Decision
    bundle: Path | None = None  # the judged generation's hang bundle
    job_blame: dict[str, Any] | None = None  # a job-wide hang's verdict, for reason.json

    def adopting(self, decision: Decision) -> Judgement:
        """The job (or the node's health) decided otherwise: the same evidence, its decision."""
        return replace(self, decision=decision)


def basis(ended: GenerationEnded) -> Basis:
    """Which way this node decides the generation's end."""
    return basis_of(
        GenerationEnd(
            succeeded=ended.result is GroupResult.SUCCEEDED,
            failed=ended.result is GroupResult.FAILED,
            restart_requested=ended.restart_requested,
            unkillable=ended.unkillable,
            requests=ended.requests,
            peer_news=None if ended.news is None else ended.news[0],
            reported=ended.reported,
            decided=ended.decided,
            blamed_elsewhere=ended.blamed_elsewhere,
        )
    )


def undisputed(way: Basis, ended: GenerationEnded, memory: Memory, now: float, node: str) -> Judgement:
    """A decision taken without this node's evidence (an operator's restart, a peer's
    news, a decision taken while the ranks ran)."""
    news, detail = (None, "") if ended.news is None else ended.news
    decision = without_evidence(way, news, memory.budget, now, detail, decided=ended.decided)
    return Judgement(Evidence((), generation=ended.number, node=node), None, decision)


async def evidence_of(
    ended: GenerationEnded, *, node: str, dmesg: tuple[str, ...], progress: int | None
) -> Evidence:
    """Every rank that failed on its own or hung, the root cause first; and the ranks
    we stopped that did not end cleanly (``Evidence.stopped``).

    A rank we stopped counts as failed when it said so first: it may have raised
    (and written its error file) before a peer failed because of it, then been slow
    to exit. Its error file, written before we signalled it, gives it away.
    """
    failed: list[RankFailure] = []
    stopped: list[RankFailure] = []
    for r in ended.ranks:
        if r.exit is None or r.state not in (RankState.FAILED, RankState.STOPPED):
            continue
        found = await failure_evidence(r.exit, r.files, r.stderr_bytes)
        hang, hang_at = r.hang if r.hang is not None else (None, None)
        said = [t for t in (r.exception_at, r.reported_at) if t is not None]
        first = bool(said) and (ended.stop_mono is None or min(said) < ended.stop_mono)
        part = part_of(r.state, exit_code=r.exit.status.code, error_at=found.error_at,
                       stop_wall=ended.stop_wall, hung=hang is not None, reported_first=first)  # fmt: skip
        if part is None or part is Part.BYSTANDER:
            continue
        after_exit = (*r.after_exit, *found.after_exit)
        found = replace(found, hang=hang, hang_at=hang_at, stacks=r.stacks, exception=r.exception,
                        notable=r.notable, after_exit=after_exit, progressed=r.progressed)  # fmt: skip
        (failed if part is Part.FAILED else stopped).append(found)
    return Evidence(
        dmesg=dmesg,
        failures=tuple(order_failures(failed)),
        stopped=tuple(order_failures(stopped)),
        unkillable=ended.unkillable,
        requests=ended.requests,
        generation=ended.number,
        node=node,
        progress=progress,
        saved=ended.saved,
    )


def progress(ended: GenerationEnded, memory: Memory) -> tuple[int | None, Memory]:
    """Iterations this generation advanced past the best before it (None if never
    told), and the memory of the new best."""
    before = memory.best_iteration
    if not ended.iterations:
        return (None if before is None else 0), memory
    best = max(ended.iterations)
    advanced = best - before if before is not None else best - min(ended.iterations) + 1
    return advanced, replace(memory, best_iteration=best if before is None else max(before, best))


def judge(
    evidence: Evidence, plugins: Registry, policy: Policy, memory: Memory, *, now: float, bundle: Path | None
) -> tuple[Judgement, Memory]:
    """Classify the evidence (the plugins) and decide (the pure policy)."""
    if evidence.failures or evidence.unkillable:
        classification: Classification | None = plugins.classify(evidence)
        assert classification is not None
        decision = decide(evidence, classification, memory.history, memory.budget, now, policy=policy)
        memory = replace(memory, history=memory.history.add(Past.of(evidence, classification, now)))
        evidence = root_first(evidence, classification.rank)  # what every record names first
        plugins.decided(evidence, classification, decision)
    else:  # only requests: nothing failed
        classification = None
        decision = decide(evidence, NOTHING, memory.history, memory.budget, now, policy=policy)
    return Judgement(evidence, classification, decision, bundle), memory


def decision_event(judgement: Judgement, restarts_used: int) -> ev.Decision:
    """The ``decision`` event."""
    evidence, c, decision = judgement.evidence, judgement.classification, judgement.decision
    rank = None if c is None else c.rank
    blame = judgement.job_blame or {}
    if blame.get("rule") == "desync" and blame.get("ranks"):  # not the rank that caught it
        rank = int(blame["ranks"][0])
    return ev.Decision(
        generation=evidence.generation,
        action=str(decision.action),
        reason=str(decision.reason),
        detail=decision.detail,
        rule=None if c is None else c.rule,
        category=None if c is None else c.category,
        rank=rank,
        classifier=None if c is None else c.source,
        lines=None if c is None else list(c.lines),
        restarts_used=restarts_used,
    )


def plugins(cfg: RunConfig, events: EventLog) -> Registry:
    """The classifier plugins (the built-in rules among them), configured with the run's rules."""

    def problem(p: Problem) -> None:
        events.emit(PluginFailed(plugin=p.plugin, stage=p.stage, error=p.error))

    registry = Registry(disabled=cfg.policy.disabled_plugins, report=problem)
    registry.configure(PluginSettings(rules=cfg.policy.rules))
    return registry


def announce(registry: Registry, cfg: RunConfig, events: EventLog) -> None:
    events.emit(
        PluginsLoaded(
            plugins=[p.name for p in registry.loaded],
            disabled=registry.disabled or None,
            failed=[p.plugin for p in registry.problems] or None,
            rule_files=list(cfg.policy.rule_files) or None,
        ),
    )
