"""Failure rules as data: an id, what text or exit they match, and what they imply.

A rule set is a list of plain mappings (the built-in ones live in
``plugins/rules/*.toml``; users add or override rules in their config file), so
an SRE changes behaviour without code. ``compile_rules`` validates every field
and raises ``RuleError`` naming the rule and the key. The fields::

    id        unique; a user rule with a built-in's id replaces it
    category  a word for humans and dashboards: nccl, cuda, xid, python, oom...
    nature    transient | hardware | deterministic | not_failure: what the policy
              does when restarts run out (reschedule, reschedule, abort, -)
    action    continue | restart | reschedule | abort, on a first occurrence
    repeat    the action once this rule has matched ``after`` times before on
              this node: "restart once, then abort" is action=restart, repeat=abort
    after     how many earlier matches on this node make ``repeat`` apply (1)
    any       regexes, the rule matches when one matches a line
    all       regexes that must all match, on lines in this order
    scope     where to look, one or a list: rank (a rank's log, error file, reported
              exception), dmesg (the kernel's log), agent (a launcher's log)
    exit      exit codes (0-255) the rank ended with, one or a list
    signal    signal names (SIGKILL...) the rank died of, one or a list
    hang      true: matches a rank declared hung (no heartbeat, a section too long)
    wrapper   true: the text wraps a cause (DistBackendError, the NCCL watchdog...);
              it classifies only when no other rule finds the cause
    fallback  true: a last resort, tried only when no other rule, wrapper or not,
              matches (an uncaught exception of no known kind)
    blame     self | peer | waiting: peer: a peer's death shows up in this rank's
              log (connection reset, ncclRemoteError): the root cause is another
              rank's failure; a group named ``peer`` in the pattern (an address,
              a rank) says which peer, where the line does. waiting: what a rank
              that waits for a peer shows (a collective's watchdog timeout): its
              own failure only when no rank of the same failure failed on its own
    when      always | before_first_step (the rank completed no step: a user error)
    by        {group: {value: action}}: the action read from a named group of the
              match (the Xid number), falling back to ``action``
    summary   one line for humans
    source    where the rule is written (the built-in loader names its file)

Patterns are matched against one line at a time, after the rank prefix torch
and torchrun add (``[rank3]:``, ``[default3]:``) is removed, so ``^`` anchors
at the message.

Every pattern, the built-in ones included, is RE2's (``supervisor.core.patterns``):
matching takes time linear in the line, so no rule can stall the daemon.
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.patterns import Pattern, RegexError, Screen, compile_pattern
from supervisor.core.types import Action

NATURES = ("transient", "hardware", "deterministic", "not_failure")
SCOPES = ("rank", "dmesg", "agent")
WHENS = ("always", "before_first_step")
BLAMES = ("self", "peer", "waiting")
RULE_KEYS = frozenset(
    {"id", "category", "nature", "action", "repeat", "after", "any", "all", "scope", "exit", "signal",
     "hang", "wrapper", "fallback", "blame", "when", "by", "summary", "source"}
)  # fmt: skip
# the module's own fixed patterns stay with ``re``: they are linear as written
_ID = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
# what torch (``[rank3]:``) and torchrun --tee (``[default3]:``) put before a rank's lines
_PREFIX = re.compile(r"^\s*(?:\[(?:rank|default)\d+\]:\s?|\[rank \d+\] )")

# the entry-point group classifier plugins register in (the built-in rules too)
PLUGIN_ENTRY_POINTS = "ft_supervisor.plugins"


class RuleError(ValueError):
    """A rule that cannot be used: the message names the rule and the key."""


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    category: str
    nature: str
    action: Action
    repeat: Action | None = None
    after: int = 1
    any: tuple[Pattern, ...] = ()
    all: tuple[Pattern, ...] = ()
    scope: tuple[str, ...] = ("rank",)
    exit_codes: frozenset[int] = frozenset()
    signals: frozenset[int] = frozenset()
    hang: bool = False
    wrapper: bool = False
    fallback: bool = False
    blame_peer: bool = False
    waiting: bool = False  # blame = "waiting"
    before_first_step: bool = False
    by: Mapping[str, Mapping[str, Action]] = field(default_factory=dict)
    summary: str = ""
    source: str = ""

    @property
    def patterns(self) -> tuple[Pattern, ...]:
        return self.any + self.all


@dataclass(frozen=True, slots=True)
class Hit:
    """A rule matched: the lines that matched it and the named groups of the first match."""

    rule: Rule
    lines: tuple[str, ...]
    groups: Mapping[str, str]
    first: int  # index of the first line that matched: earlier is nearer the cause

    @property
    def action(self) -> Action:
        for group, actions in self.rule.by.items():
            value = self.groups.get(group)
            if value is not None and value in actions:
                return actions[value]
        return self.rule.action


def strip_prefix(line: str) -> str:
    return _PREFIX.sub("", line, count=1)


def _shown(value: object, limit: int = 80) -> str:
    """``value`` as an error quotes it: one from a rules file may be long."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _fail(rule_id: str, key: str, expected: str, got: object) -> RuleError:
    return RuleError(f"rule {rule_id!r}: {key} must be {expected}, got {_shown(got)}")


def _action(rule_id: str, key: str, value: object) -> Action:
    try:
        return Action(str(value))
    except ValueError:
        raise _fail(rule_id, key, "one of " + ", ".join(a.value for a in Action), value) from None


def _choice(rule_id: str, raw: Mapping[str, Any], key: str, choices: Sequence[str], default: str) -> str:
    value = raw.get(key, default)
    if value not in choices:
        raise _fail(rule_id, key, "one of " + ", ".join(choices), value)
    return str(value)


def _scopes(rule_id: str, value: object) -> tuple[str, ...]:
    scopes = [value] if isinstance(value, str) else value
    if not isinstance(scopes, list | tuple) or not scopes or any(s not in SCOPES for s in scopes):
        raise _fail(rule_id, "scope", "one or a list of " + ", ".join(SCOPES), value)
    return tuple(str(s) for s in scopes)


def _patterns(rule_id: str, raw: Mapping[str, Any], key: str) -> tuple[Pattern, ...]:
    value = raw.get(key, ())
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
        raise _fail(rule_id, key, "a list of regular expressions", value)
    compiled: list[Pattern] = []
    for pattern in value:
        try:
            compiled.append(compile_pattern(pattern))
        except RegexError as exc:
            raise RuleError(
                f"rule {rule_id!r}: {key} pattern {_shown(pattern)} is not a valid regex: {exc} "
                "(the syntax is RE2's: no backreferences or lookaround, \\z for \\Z)"
            ) from None
    return tuple(compiled)


def _exit_codes(rule_id: str, value: object) -> frozenset[int]:
    codes = [value] if isinstance(value, int) else value
    if not isinstance(codes, list | tuple) or not all(
        isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255 for c in codes
    ):
        raise _fail(rule_id, "exit", "a list of exit codes 0-255", value)
    return frozenset(codes)


def _signals(rule_id: str, value: object) -> frozenset[int]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple):
        raise _fail(rule_id, "signal", "a list of signal names such as SIGKILL", value)
    out = set()
    for name in names:
        try:
            out.add(int(_signal.Signals[str(name).upper()]))
        except KeyError:
            raise _fail(rule_id, "signal", "a list of signal names such as SIGKILL", name) from None
    return frozenset(out)


def _by(rule_id: str, value: object) -> dict[str, dict[str, Action]]:
    if not isinstance(value, Mapping):
        raise _fail(rule_id, "by", "a table {group: {value: action}}", value)
    out: dict[str, dict[str, Action]] = {}
    for group, table in value.items():
        if not isinstance(table, Mapping):
            raise _fail(rule_id, f"by.{group}", "a table {value: action}", table)
        out[str(group)] = {str(k): _action(rule_id, f"by.{group}.{k}", v) for k, v in table.items()}
    return out


def _flag(rule_id: str, raw: Mapping[str, Any], key: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise _fail(rule_id, key, "true or false", value)
    return value


def compile_rule(raw: Mapping[str, Any]) -> Rule:
    if not isinstance(raw, Mapping):
        raise RuleError(f"a rule must be a table of fields, got {_shown(raw)}")
    rule_id = raw.get("id")
    if not isinstance(rule_id, str) or not _ID.fullmatch(rule_id):
        raise RuleError(f"every rule needs an id (letters, digits, _ . -), got {_shown(rule_id)}")
    unknown = sorted(map(str, set(raw) - RULE_KEYS))  # str: a YAML key may be a number
    if unknown:
        raise RuleError(f"rule {rule_id!r}: unknown key(s) {unknown}; known: {sorted(RULE_KEYS)}")
    after = raw.get("after", 1)
    if not isinstance(after, int) or isinstance(after, bool) or after < 1:
        raise _fail(rule_id, "after", "an integer >= 1", after)
    rule = Rule(
        id=rule_id,
        category=str(raw.get("category", "other")),
        nature=_choice(rule_id, raw, "nature", NATURES, "transient"),
        action=_action(rule_id, "action", raw.get("action", "restart")),
        repeat=None if raw.get("repeat") is None else _action(rule_id, "repeat", raw["repeat"]),
        after=after,
        any=_patterns(rule_id, raw, "any"),
        all=_patterns(rule_id, raw, "all"),
        scope=_scopes(rule_id, raw.get("scope", "rank")),
        exit_codes=_exit_codes(rule_id, raw.get("exit", ())),
        signals=_signals(rule_id, raw.get("signal", ())),
        hang=_flag(rule_id, raw, "hang"),
        wrapper=_flag(rule_id, raw, "wrapper"),
        fallback=_flag(rule_id, raw, "fallback"),
        blame_peer=_choice(rule_id, raw, "blame", BLAMES, "self") == "peer",
        waiting=raw.get("blame") == "waiting",
        before_first_step=_choice(rule_id, raw, "when", WHENS, "always") == "before_first_step",
        by=_by(rule_id, raw.get("by", {})),
        summary=str(raw.get("summary", "")),
        source=str(raw.get("source", "")),
    )
    if not (rule.patterns or rule.exit_codes or rule.signals or rule.hang):
        raise RuleError(f"rule {rule_id!r}: needs something to match: any, all, exit, signal or hang")
    if rule.any and rule.all:
        raise RuleError(f"rule {rule_id!r}: use either any or all, not both")
    return rule


def compile_rules(*layers: Iterable[Mapping[str, Any]]) -> tuple[Rule, ...]:
    """Compile rule layers, later layers first: a rule whose id an earlier layer
    used replaces it in place; new rules go before every earlier layer's, so a
    user's rules are tried before the built-in ones."""
    ordered: list[Rule] = []
    for layer in layers:
        fresh: list[Rule] = []
        seen: set[str] = set()
        for raw in layer:
            rule = compile_rule(raw)
            if rule.id in seen:
                raise RuleError(f"rule {rule.id!r} is defined twice")
            seen.add(rule.id)
            index = next((i for i, r in enumerate(ordered) if r.id == rule.id), None)
            if index is None:
                fresh.append(rule)
            else:
                ordered[index] = rule
        ordered = fresh + ordered
    return tuple(ordered)


def match_lines(
    rule: Rule, lines: Sequence[str], max_lines: int = 8, where: Mapping[str, Sequence[int]] | None = None
) -> Hit | None:
    """Match a text rule against lines (prefixes already stripped). ``where``: the
    lines (indices, ascending) each pattern, by its text, matches (``Screen.index``):
    only those are searched (for the groups)."""

    def candidates(patterns: Iterable[Pattern]) -> Iterable[int]:
        if where is None:
            return range(len(lines))
        return sorted({i for p in patterns for i in where.get(p.pattern, ())})

    if rule.any:
        found: list[str] = []
        groups: dict[str, str] = {}
        first = -1
        for i in candidates(rule.any):
            line = lines[i]
            for pattern in rule.any:
                m = pattern.search(line)
                if m is None:
                    continue
                if first < 0:
                    first, groups = i, {k: v for k, v in m.groupdict().items() if v is not None}
                if len(found) < max_lines:
                    found.append(line)
                break
        return Hit(rule, tuple(found), groups, first) if first >= 0 else None
    if rule.all:
        found, groups, start, first = [], {}, 0, -1
        for pattern in rule.all:
            for i in candidates((pattern,)):
                m = pattern.search(lines[i]) if i >= start else None
                if m is not None:
                    found.append(lines[i])
                    groups.update({k: v for k, v in m.groupdict().items() if v is not None})
                    first = i if first < 0 else first
                    start = i
                    break
            else:
                return None
        return Hit(rule, tuple(found), groups, first)
    return None


def prefilter(rules: Iterable[Rule]) -> Screen:
    """What finds every line any text rule could match."""
    return Screen(p for rule in rules for p in rule.patterns)
