"""The generated reference pages (docs/reference/) are current, and complete: every option
of every subcommand, every rules-file key and built-in rule, every exit code of the
contract and every reason.json field is on its page. Regenerate a stale page with the
script the assertion names."""

from __future__ import annotations

import argparse
import importlib.util
import re
from dataclasses import fields
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from supervisor.core.exitcodes import ExitCodes
from supervisor.core.rules import RULE_KEYS

ROOT = Path(__file__).parents[2]
PAGES = {
    "gen_cli_reference": "cli.md",
    "gen_rules_reference": "rules.md",
    "gen_exit_codes_reference": "exit-codes.md",
    "gen_reason_reference": "reason-json.md",
}


@cache
def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def _rendered(name: str) -> str:
    text: str = _script(name).render()
    return text


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_page_is_current(name: str) -> None:
    written = (ROOT / "docs" / "reference" / PAGES[name]).read_text()
    assert written == _rendered(name), f"stale: run python scripts/{name}.py"


def test_every_option_of_every_subcommand_is_in_the_reference() -> None:
    script = _script("gen_cli_reference")
    text = _rendered("gen_cli_reference")
    commands = script.subcommands(script.parser())
    assert {name for name, _, _ in commands} >= {"run", "status", "events", "stop", "restart", "classify",
                                                  "plugins", "report", "node"}  # fmt: skip
    run = next(sp for name, _, sp in commands if name == "run")
    missing = []
    for name, _, sp in commands:
        assert f"\n## {name}\n" in text, f"no section for {name}"
        section = text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        for action in sp._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            names = action.option_strings or [action.metavar or action.dest]
            missing += [f"{name} {s}" for s in names if f"`{s}`" not in section]
            if action.option_strings and not script._help(action, run):
                missing.append(f"{name} {action.option_strings[0]}: no meaning")
    assert not missing, missing


def test_every_rule_key_and_builtin_rule_is_in_the_reference() -> None:
    script = _script("gen_rules_reference")
    text = _rendered("gen_rules_reference")
    keys = text.split("## Keys", 1)[1].split("## Built-in rules", 1)[0]
    assert len(RULE_KEYS) == 19
    for key in RULE_KEYS:
        row = re.search(rf"^\| `{key}` \| [^|]+ \| (.+) \|$", keys, re.M)
        assert row is not None and row.group(1).strip(), f"rule key {key} has no row with its meaning"
    table = text.split("## Built-in rules", 1)[1]
    rules = script.builtin_rules()
    assert len(rules) > 10
    for rule in rules:
        assert f"| `{rule.id}` |" in table, rule.id


def test_every_exit_code_of_the_contract_is_in_the_reference() -> None:
    text = _rendered("gen_exit_codes_reference")
    codes = ExitCodes()
    for f in fields(ExitCodes):
        assert f"\n| {getattr(codes, f.name)} |" in text, f.name
    assert "\n| 0 |" in text and "128+N" in text


def test_every_reason_field_is_in_the_reference() -> None:
    script = _script("gen_reason_reference")
    text = _rendered("gen_reason_reference")
    written = script._written()
    keys = {k for content in written.values() for k in content}
    assert {"outcome", "exit_code", "decision", "rule", "root_cause", "last_failure"} <= keys
    for key in keys:
        assert f"| `{key}` |" in text, key


def test_no_page_cites_a_file_outside_the_repository() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    citing = [str(p.relative_to(ROOT)) for p in pages if "DESIGN.md" in p.read_text()]
    assert not citing, f"DESIGN.md is not in the repository: {citing}"


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    assert "\n## Install" in readme
    for command in ("bash scripts/demo.sh", "bash scripts/test.sh"):
        assert command in readme
    codes = ExitCodes()  # its exit-code table is the contract's
    for f in fields(ExitCodes):
        assert f"\n| {getattr(codes, f.name)} |" in readme, f.name


def test_the_readme_links_resolve() -> None:
    """mkdocs --strict checks the site's links; the README is outside it."""
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, missing
