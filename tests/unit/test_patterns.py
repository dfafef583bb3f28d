"""Rule patterns run on RE2: linear time whatever the pattern (issue 12: ``(a+)+$``
wedged the loop), the built-in rules matching exactly as Python's ``re`` did, and the
one-pass screen answering as a search per pattern would."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from ft_supervisor_plugins.rules import rule_set
from supervisor.config.errors import ConfigError
from supervisor.config.policy import user_rules
from supervisor.core import patterns
from supervisor.core.classify import classify, classify_lines
from supervisor.core.evidence import Evidence
from supervisor.core.patterns import Screen
from supervisor.core.rules import RuleError, compile_rule, compile_rules, prefilter, strip_prefix
from supervisor.core.types import ExitStatus, RankExit, RankFailure

FAILURES = Path(__file__).resolve().parent.parent / "fixtures" / "failures"
CASES = tomllib.loads((FAILURES / "cases.toml").read_text())["case"]
RULES = rule_set()
CATASTROPHIC = "(a+)+$"  # Python's re: 2^n steps on n a's and a "!"


def _corpus() -> list[str]:
    lines = [strip_prefix(line) for f in sorted(FAILURES.iterdir()) if f.suffix != ".toml"
             for line in f.read_text(errors="replace").splitlines()]  # fmt: skip
    assert len(lines) > 500
    return lines


def _failure(*lines: str) -> RankFailure:
    return RankFailure(RankExit(0, 0, 100, ExitStatus(code=1), at=1.0, at_wall=1.0), log_tail=lines)


def test_every_builtin_pattern_matches_the_corpus_as_python_re_does() -> None:
    lines = _corpus()
    screen = prefilter(RULES)
    checked = 0
    for rule in RULES:
        for pattern in rule.patterns:
            python = re.compile(pattern.pattern)
            for line in lines:
                ours, theirs = pattern.search(line), python.search(line)
                assert (ours is None) == (theirs is None), (rule.id, pattern.pattern, line)
                if ours is not None and theirs is not None:
                    assert ours.groupdict() == theirs.groupdict(), (rule.id, line)
                    checked += 1
                assert (pattern.pattern in screen.matches(line)) == (ours is not None), (rule.id, line)
    assert checked > 300  # the corpus does exercise the patterns


def test_the_screen_classifies_as_a_search_per_pattern_does(monkeypatch: pytest.MonkeyPatch) -> None:
    with_set = [classify(RULES, Evidence((_failure(*_case_lines(c)),))) for c in CASES]
    # without the set (as when a rule set is too large for one), each pattern is searched
    monkeypatch.setattr(patterns, "_set", lambda texts: None)
    assert [classify(RULES, Evidence((_failure(*_case_lines(c)),))) for c in CASES] == with_set


def _case_lines(case: dict[str, object]) -> tuple[str, ...]:
    return tuple((FAILURES / str(case["file"])).read_text(errors="replace").splitlines())


@pytest.mark.timeout(10)  # with Python's re the first line alone takes hours
def test_a_catastrophic_user_pattern_cannot_stall_classification() -> None:
    rules = compile_rules([
        {"id": "BAD", "any": [CATASTROPHIC], "action": "abort"},
        {"id": "AAA", "all": ["^a{34}!$", CATASTROPHIC], "action": "abort"},
        {"id": "TAIL", "any": ["a{34}!"], "action": "restart"},
    ])  # fmt: skip
    lines = ["a" * 34 + "!", "a" * 60_000 + "!", "b" * 60_000]
    found = classify_lines(rules, lines)
    assert found is not None and found.rule == "TAIL"
    assert prefilter(rules).search("a" * 60_000 + "!")


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(\w+) \1", r"invalid escape sequence: \1"),  # a backreference
        (r"foo(?=bar)", "invalid perl operator: (?="),  # lookahead
        (r"(?<!x)y", "invalid perl operator: (?<"),  # lookbehind
        (r"end\Z", r"invalid escape sequence: \Z"),  # RE2 spells it \z
        ("(", "missing ): ("),
    ],
)
def test_a_pattern_re2_rejects_names_the_rule_and_the_pattern(pattern: str, why: str) -> None:
    with pytest.raises(RuleError) as err:
        compile_rule({"id": "SITE7", "any": ["fine", pattern]})
    said = str(err.value)
    assert said.startswith(f"rule 'SITE7': any pattern {pattern!r} is not a valid regex: {why}")
    assert "RE2" in said and "\n" not in said


def test_a_rules_file_with_a_pattern_re2_rejects_fails_to_load(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  - id: LOOK\n    any: ['error(?!: expected)']\n    action: abort\n")
    with pytest.raises(ConfigError, match=r"--rules .*rules\.yaml: rule 'LOOK': any pattern"):
        user_rules([str(path)])


def test_lines_re2_cannot_encode_are_classified_too() -> None:
    lone = "RuntimeError: CUDA error: an illegal memory access was encountered \ud800"
    found = classify_lines(RULES, [lone, "caf\u00e9 \u2713"])
    assert found is not None and found.rule != "unclassified"
    assert Screen(RULES[0].patterns).search("\udcff") is False


def test_the_patterns_semantics_unicode_classes_are_ascii() -> None:
    """The one place RE2 and Python's re differ on valid patterns, written down."""
    word = compile_rule({"id": "W", "any": [r"^\w+$"]}).any[0]
    assert word.search("abc_1") is not None
    assert word.search("caf\u00e9") is None  # Python's re: a match
    assert compile_rule({"id": "W2", "any": [r"^[\p{L}\w]+$"]}).any[0].search("caf\u00e9") is not None
