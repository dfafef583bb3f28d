"""Plugin hooks (pluggy): how a classifier joins the daemon.

A plugin is a module (or object) with functions marked ``@hookimpl`` and an
entry point in the ``ft_supervisor.plugins`` group::

    # pyproject.toml of your package
    [project.entry-points."ft_supervisor.plugins"]
    my_rules = "my_package.ft_plugin"

    # my_package/ft_plugin.py
    from supervisor.hooks import hookimpl
    from supervisor.core.classify import Classification
    from supervisor.core.types import Action

    @hookimpl
    def classify_failure(evidence):
        for failure in evidence.failures:
            if any("MyStorageError" in line for line in failure.texts()):
                return Classification("MY1", "storage", "hardware", Action.RESCHEDULE,
                                      rank=failure.exit.rank, summary="our filer is down")
        return None   # not mine: the next classifier tries

Third-party classifiers are asked before the built-in ones (which are marked
``trylast``); the first that returns a Classification wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pluggy

from supervisor.core.classify import Classification
from supervisor.core.evidence import Evidence
from supervisor.core.rules import PLUGIN_ENTRY_POINTS
from supervisor.core.types import Decision

PROJECT = "ft_supervisor"
ENTRY_POINT_GROUP = PLUGIN_ENTRY_POINTS

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass(frozen=True, slots=True)
class PluginSettings:
    """What a plugin is told once, before any failure: the user's extra rules
    (validated already) and the options under the plugin's own name in the config."""

    rules: Sequence[Mapping[str, Any]] = ()
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


class Specs:
    @hookspec
    def configure(self, settings: PluginSettings) -> None:
        """Called once when the plugin is loaded, before any failure."""

    @hookspec(firstresult=True)
    def classify_failure(self, evidence: Evidence) -> Classification | None:
        """Explain a failed generation, or return None to let the next classifier try."""

    @hookspec
    def on_decision(self, evidence: Evidence, classification: Classification, decision: Decision) -> None:
        """Told every decision (to alert, to record); the return value is ignored."""


__all__ = ["ENTRY_POINT_GROUP", "PluginSettings", "Specs", "hookimpl", "hookspec"]
