"""Load the plugins of the ``ft_supervisor.plugins`` entry-point group, and call
them so that none can take the daemon down.

A plugin that fails to import, whose hooks do not match the specs, or that
raises when called is reported (its name and the error) and skipped; the chain
goes on. A classifier that returns something other than a Classification is
treated the same way. When no plugin explains a failure, the result is the
``unclassified`` classification (restart, within the budget).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import pluggy

from supervisor.core.classify import Classification, unclassified
from supervisor.core.evidence import Evidence
from supervisor.core.types import Decision
from supervisor.hooks import ENTRY_POINT_GROUP, PROJECT, PluginSettings, Specs


@dataclass(frozen=True, slots=True)
class Problem:
    plugin: str
    stage: str  # load | configure | classify_failure | on_decision
    error: str


@dataclass(frozen=True, slots=True)
class Loaded:
    name: str
    value: str  # the entry point's target, module:attr
    hooks: tuple[str, ...]


Report = Callable[[Problem], None]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Registry:
    def __init__(
        self,
        *,
        disabled: Iterable[str] = (),
        entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
        report: Report | None = None,
    ) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(Specs)
        self.loaded: list[Loaded] = []
        self.disabled: list[str] = []
        self.problems: list[Problem] = []
        self._report = report
        skip = set(disabled)
        found = (
            entry_points
            if entry_points is not None
            else importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        )
        # a sorted order, so that plugins of the same rank are called the same way every run
        for ep in sorted(found, key=lambda e: e.name):
            if ep.name in skip:
                self.disabled.append(ep.name)
                continue
            self._load(ep)

    def _problem(self, plugin: str, stage: str, exc: BaseException | str) -> None:
        problem = Problem(plugin, stage, exc if isinstance(exc, str) else _describe(exc))
        self.problems.append(problem)
        if self._report is not None:
            self._report(problem)

    def _load(self, ep: importlib.metadata.EntryPoint) -> None:
        if self.pm.has_plugin(ep.name):
            self._problem(ep.name, "load", f"another plugin is already named {ep.name!r}")
            return
        try:
            plugin = ep.load()
            self.pm.register(plugin, name=ep.name)
        except Exception as exc:
            self._problem(ep.name, "load", exc)
            return
        try:
            self.pm.check_pending()  # a hook that no spec knows: a typo, or a plugin for another version
        except pluggy.PluginValidationError as exc:
            self.pm.unregister(name=ep.name)
            self._problem(ep.name, "load", exc)
            return
        hooks = tuple(h.name for h in self.pm.get_hookcallers(plugin) or ())
        self.loaded.append(Loaded(ep.name, ep.value, hooks))

    def _impls(self, hook: str) -> list[pluggy.HookImpl]:
        # pluggy's own call order: tryfirst ones, then the latest registered, trylast ones last
        return list(reversed(getattr(self.pm.hook, hook).get_hookimpls()))

    def _call(self, impl: pluggy.HookImpl, hook: str, **kwargs: Any) -> Any:
        args = {name: kwargs[name] for name in impl.argnames}
        try:
            return impl.function(**args)
        except Exception as exc:
            self._problem(impl.plugin_name, hook, exc)
            return None

    def configure(self, settings: PluginSettings) -> None:
        for impl in self._impls("configure"):
            self._call(impl, "configure", settings=settings)

    def classify(self, evidence: Evidence) -> Classification:
        for impl in self._impls("classify_failure"):
            result = self._call(impl, "classify_failure", evidence=evidence)
            if result is None:
                continue
            if not isinstance(result, Classification):
                self._problem(impl.plugin_name, "classify_failure", f"returned {type(result).__name__}, "
                              "not a Classification or None")  # fmt: skip
                continue
            return result if result.source else replace(result, source=impl.plugin_name)
        root = evidence.failures[0] if evidence.failures else None
        return unclassified(root.exit.rank if root is not None else None)

    def decided(self, evidence: Evidence, classification: Classification, decision: Decision) -> None:
        for impl in self._impls("on_decision"):
            self._call(
                impl, "on_decision", evidence=evidence, classification=classification, decision=decision
            )
