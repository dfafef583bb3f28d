"""The built-in rule set as a classifier plugin.

The rules are data (``*.toml`` beside this file, peers.md section 6): read in
the order below, most specific first, with the user's rules (``--rules FILE``,
or ``rules`` in the config file) tried before them; a user rule with a
built-in's id replaces it. Marked ``trylast`` so that any other plugin is asked
first.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from supervisor.core.classify import Classification, classify
from supervisor.core.evidence import Evidence
from supervisor.core.rules import Rule, compile_rules
from supervisor.hooks import PluginSettings, hookimpl

HERE = Path(__file__).resolve().parent
# hardware first, then deterministic bugs, then what is transient; a peer's death
# (blamed on the peer) and the exit-status rules after the text rules
ORDER = ("cuda", "nccl", "distributed", "system", "python", "exits", "xid")


@cache
def builtin_layer() -> tuple[Mapping[str, Any], ...]:
    out: list[Mapping[str, Any]] = []
    for name in ORDER:
        with (HERE / f"{name}.toml").open("rb") as f:
            out += [
                {**rule, "source": rule.get("source", f"plugins/rules/{name}.toml")}
                for rule in tomllib.load(f)["rule"]
            ]
    return tuple(out)


def rule_set(user: Sequence[Mapping[str, Any]] = ()) -> tuple[Rule, ...]:
    return compile_rules(builtin_layer(), user)


class RulesPlugin:
    def __init__(self) -> None:
        self.rules = rule_set()

    def builtin_rules(self) -> tuple[Mapping[str, Any], ...]:
        """The built-in layer, for the options' check of user overrides."""
        return builtin_layer()

    @hookimpl
    def configure(self, settings: PluginSettings) -> None:
        self.rules = rule_set(settings.rules)

    @hookimpl(trylast=True)
    def classify_failure(self, evidence: Evidence) -> Classification | None:
        return classify(self.rules, evidence)


plugin = RulesPlugin()
