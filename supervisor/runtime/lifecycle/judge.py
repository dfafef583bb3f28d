"""From a generation that did not simply succeed to a decision.

Gathers the evidence (``aftermath``), asks the classifier plugins what it was,
and asks the pure policy what to do, remembering what happened on this node
(the history the policy escalates from) and the restart budget. Every step is
an event with the same field names as the reason file.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

from supervisor.clock import Clock
from supervisor.config.run import RunConfig
from supervisor.core.classify import Classification
from supervisor.core.evidence import Evidence, WorkloadRequest
from supervisor.core.policy import Budget, History, Past, decide
from supervisor.core.types import Action, Decision
from supervisor.hooks import PluginSettings
from supervisor.hooks.registry import Problem, Registry
from supervisor.runtime.lifecycle import aftermath
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.records import reason as outcome
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.records.failure_text import render_failure


class Judge:
    def __init__(self, cfg: RunConfig, events: EventLog, clock: Clock) -> None:
        self.cfg = cfg
        self._events = events
        self._clock = clock
        self.budget = Budget(cfg.max_restarts, cfg.policy.restart_window)
        self.policy = cfg.policy.policy
        self.history = History()
        self.node = socket.gethostname()
        self._best_iteration: int | None = None
        self.plugins = Registry(disabled=cfg.policy.disabled_plugins, report=self._plugin_problem)
        self.plugins.configure(PluginSettings(rules=cfg.policy.rules))
        # the last judgement, for the reason file
        self.evidence: Evidence | None = None
        self.classification: Classification | None = None
        self.decision: Decision | None = None
        self.bundle: Path | None = None  # the judged generation's hang bundle

    def announce(self) -> None:
        self._events.emit(
            "plugins_loaded",
            plugins=[p.name for p in self.plugins.loaded],
            disabled=self.plugins.disabled or None,
            failed=[p.plugin for p in self.plugins.problems] or None,
            rule_files=list(self.cfg.policy.rule_files) or None,
        )

    def _plugin_problem(self, problem: Problem) -> None:
        self._events.emit(
            "plugin_failed", logging.ERROR, plugin=problem.plugin, stage=problem.stage, error=problem.error
        )

    def remaining(self) -> int:
        return self.budget.remaining(self._clock.monotonic())

    def restarted(self) -> None:
        self.budget = self.budget.spend(self._clock.monotonic())

    def _progress(self, monitor: Monitor) -> int | None:
        """Iterations this generation advanced past the best before it; None if never told."""
        seen = monitor.iterations()
        before = self._best_iteration
        if not seen:
            return None if before is None else 0
        best = max(seen)
        self._best_iteration = best if before is None else max(before, best)
        return best - before if before is not None else best - min(seen) + 1

    async def judge(
        self,
        gen: Generation,
        monitor: Monitor,
        unkillable: tuple[int, ...],
        requests: tuple[WorkloadRequest, ...],
        dmesg: tuple[str, ...] = (),
    ) -> Decision:
        failed, stopped = await aftermath.failures(gen, monitor)
        evidence = Evidence(
            dmesg=dmesg,
            failures=failed,
            stopped=stopped,
            unkillable=unkillable,
            requests=requests,
            generation=gen.number,
            node=self.node,
            progress=self._progress(monitor),
            saved=monitor.saved(),
        )
        now = self._clock.monotonic()
        if evidence.failures or unkillable:
            classification = self.plugins.classify(evidence)
            decision = decide(evidence, classification, self.history, self.budget, now, policy=self.policy)
            self.history = self.history.add(Past.of(evidence, classification, now))
        else:  # only requests: nothing failed
            classification = None
            decision = decide(evidence, _NOTHING, self.history, self.budget, now, policy=self.policy)
        self.evidence, self.classification, self.decision = evidence, classification, decision
        self.bundle = gen.bundle
        self._emit(evidence, classification, decision)
        if classification is not None:
            self.plugins.decided(evidence, classification, decision)
        return decision

    def adopt(self, decision: Decision, generation: int) -> None:
        """The job decided for this node (a peer's abort, a job-wide reschedule,
        a rendezvous that ended): keep this node's evidence, record the decision."""
        if self.evidence is None:
            self.evidence = Evidence((), generation=generation, node=self.node)
        self.decision = decision
        self._emit(self.evidence, self.classification, decision)

    def without_evidence(self, generation: int, decision: Decision) -> Decision:
        """Record a decision taken without this node's evidence (an operator's
        restart, a peer's news)."""
        self.evidence = Evidence((), generation=generation, node=self.node)
        self.classification, self.decision = None, decision
        self.bundle = None
        self._emit(self.evidence, None, decision)
        return decision

    def report(self, decision: Decision, logger: logging.Logger, run_dir: Path) -> None:
        """The run ends on this decision: tell the operator, and OSMO's launch script."""
        evidence, c = self.evidence, self.classification
        if evidence is None:
            return
        if decision.action in (Action.ABORT, Action.RESCHEDULE):
            logger.error("%s", render_failure(evidence, c, decision, run_dir))
        prefix = self.cfg.policy.error_log_prefix
        if not prefix:
            return
        try:
            written = outcome.error_logs(prefix, evidence, c, decision)
        except OSError as exc:
            self._events.emit("error_logs_unwritable", logging.WARNING, prefix=prefix, error=str(exc))
            return
        if written:
            self._events.emit("error_logs_written", files=[str(p) for p in written])

    def reason(self, code: int, *, stopped: bool, generation: int | None) -> dict[str, Any]:
        decision = self.decision
        if stopped:
            result = "stopped"
        elif code == 0:
            result = "success" if decision is None or decision.action is not Action.CONTINUE else "continue"
        elif decision is not None and decision.action is not Action.RESTART:
            result = str(decision.action)
        else:
            result = "failed"
        ended_by_failure = result not in ("success", "continue", "stopped")
        content = outcome.reason(
            exit_code=code,
            outcome=result,
            run_id=self.cfg.run_id,
            node=self.node,
            generation=generation,
            restarts_used=self.budget.used,
            max_restarts=self.cfg.max_restarts,
            evidence=self.evidence if ended_by_failure else None,
            classification=self.classification if ended_by_failure else None,
            decision=decision if ended_by_failure or result == "continue" else None,
        )
        bundle = None if self.bundle is None else str(self.bundle)
        if ended_by_failure:
            content["bundle"] = bundle  # the hang's diagnostic bundle, when it was a hang
        if not ended_by_failure and self.classification is not None and decision is not None:
            # the run went on after it: history, not the reason the run ended
            content["last_failure"] = {
                "generation": None if self.evidence is None else self.evidence.generation,
                "rule": self.classification.rule,
                "rank": self.classification.rank,
                "action": str(decision.action),
                "detail": decision.detail,
                "bundle": bundle,
            }
        return content

    def _emit(self, evidence: Evidence, c: Classification | None, decision: Decision) -> None:
        self._events.emit(
            "decision",
            logging.WARNING,
            generation=evidence.generation,
            action=str(decision.action),
            reason=str(decision.reason),
            detail=decision.detail,
            rule=None if c is None else c.rule,
            category=None if c is None else c.category,
            rank=None if c is None else c.rank,
            classifier=None if c is None else c.source,
            lines=None if c is None else list(c.lines),
            restarts_used=self.budget.used,
        )


# a generation that ended on a workload request alone: nothing to classify
_NOTHING = Classification("none", "request", "transient", Action.CONTINUE, summary="no failure")
