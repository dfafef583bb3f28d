"""Golden failure texts (tests/fixtures/failures, see its README) through the built-in rules:
each case names the rule that must classify it, the first-occurrence action, the wrappers
it unwraps and lines the evidence must quote."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from ft_supervisor_plugins.rules import rule_set
from supervisor.core.classify import UNCLASSIFIED, classify
from supervisor.core.evidence import Evidence
from supervisor.core.notable import GOING_DOWN, is_notable, says_going_down, says_timed_out_waiting
from supervisor.core.policy import Budget, History, decide
from supervisor.core.rules import strip_prefix
from supervisor.core.types import ExitStatus, RankExit, RankFailure

HERE = Path(__file__).resolve().parent.parent / "fixtures" / "failures"
CASES: list[dict[str, Any]] = tomllib.loads((HERE / "cases.toml").read_text())["case"]
RULES = rule_set()


def _evidence(case: dict[str, Any]) -> Evidence:
    lines = tuple((HERE / case["file"]).read_text(errors="replace").splitlines())
    exit = RankExit(0, 0, 100, ExitStatus(code=1), at=1.0, at_wall=1.0)
    if case["scope"] == "dmesg":
        # the rank itself said nothing a rule knows: the kernel's lines decide
        return Evidence((RankFailure(exit, log_tail=("Traceback (most recent call last):",)),), dmesg=lines)
    if case["scope"] == "agent_log":
        # what the daemon would know of a launcher's run: nothing but the log (and whether
        # the ranks ever stepped, for P1)
        progress = 0 if case.get("progressed") is False else None
        return Evidence((RankFailure(exit),), agent_log=lines, progress=progress)
    return Evidence((RankFailure(exit, log_tail=lines, progressed=case.get("progressed", True)),))


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_golden(case: dict[str, Any]) -> None:
    evidence = _evidence(case)
    c = classify(RULES, evidence)
    expected_rule = UNCLASSIFIED if case["rule"] == "none" else case["rule"]
    if case["rule"] == "none":
        # nothing specific may match; the generic Python fallback is allowed
        assert c.rule in (UNCLASSIFIED, "P9"), c
    elif case["action"] == "continue":
        # a benign Xid explains no crash: the rank's own failure stands
        assert c.rule in (UNCLASSIFIED, expected_rule), c
    else:
        assert c.rule == expected_rule, c
        for text in map(strip_prefix, case.get("lines", [])):  # evidence lines lose the rank prefix
            assert any(text in line for line in c.lines), (text, c.lines)
        assert set(case.get("wrapped_by", [])) <= set(c.wrapped_by), c.wrapped_by
        assert c.peer == case.get("peer", False)
    decision = decide(evidence, c, History(), Budget(3), now=0.0)
    expected = case["action"]
    if expected == "continue":  # a benign Xid next to a failed rank: the rank's failure decides
        expected = "restart"
    assert str(decision.action) == expected, (c, decision)


def test_the_corpus_covers_every_rule() -> None:
    covered = {c["rule"] for c in CASES} | {w for c in CASES for w in c.get("wrapped_by", [])}
    text_rules = {r.id for r in RULES if r.patterns and not r.fallback}
    assert text_rules <= covered, sorted(text_rules - covered)


def test_every_line_a_builtin_rule_matches_passes_the_keyword_prefilter() -> None:
    """What the live scanner and ``classify`` keep must include every line a rule needs."""
    missed = []
    for case in CASES:
        for line in (HERE / case["file"]).read_text(errors="replace").splitlines():
            text = strip_prefix(line)
            hits = [r.id for r in RULES if any(p.search(text) for p in r.patterns)]
            if hits and not is_notable(line):
                missed.append((case["file"], hits, line))
    assert not missed, missed


def test_only_torch_s_own_teardown_lines_say_a_rank_is_going_down() -> None:
    """A rank that says it goes down and stays is ended after --exit-grace: only the lines
    torch prints as it takes the process down may say so, and the live scanner keeps them."""
    logs = {c["file"]: (HERE / c["file"]).read_text(errors="replace") for c in CASES if c["scope"] != "dmesg"}
    said = {name for name, text in logs.items() if any(map(says_going_down, text.splitlines()))}
    assert "n1_watchdog_timeout_captured_h200.log" in said
    # every case that says so went through NCCL's watchdog; no Python, gloo or plain CUDA failure does
    nccl = {c["file"] for c in CASES if any(r.startswith("N") for r in (c["rule"], *c.get("wrapped_by", [])))}
    assert said <= nccl, sorted(said - nccl)
    assert all(is_notable(phrase) for phrase in GOING_DOWN)


def test_a_rank_says_it_timed_out_waiting_exactly_where_a_waiting_rule_matches() -> None:
    """A rank that says so makes its node declare the job's incident: the live scanner's words
    for it (``says_timed_out_waiting``) and the rules that classify such a rank as the one that
    waited (``blame = "waiting"``: N1, D7) must read the corpus alike, line for line."""
    waiting = [r for r in RULES if r.waiting]
    assert {r.id for r in waiting} >= {"N1", "D7"}
    unlike = []
    for case in CASES:
        if case["scope"] == "dmesg":
            continue
        for line in (HERE / case["file"]).read_text(errors="replace").splitlines():
            text = strip_prefix(line)
            if any(p.search(text) for r in waiting for p in r.patterns) != says_timed_out_waiting(line):
                unlike.append((case["file"], line))
    assert not unlike, unlike
