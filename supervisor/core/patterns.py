r"""The regex engine of the classifier's rules: RE2 (google-re2), in linear time.

Rule patterns, the user's (``--rules``) and the built-in ones alike, run against
what ranks print, on the daemon's loop. Python's ``re`` backtracks: ``(a+)+$``
against 34 a's and a ``!`` takes hours, and supervision with it. RE2 matches in
time linear in the line whatever the pattern, so no rule and no line can stop
supervision; a pattern too large for RE2's memory bound fails to compile.

Every built-in pattern is valid RE2 and matches the golden corpus exactly as
``re`` does (``tests/unit/test_patterns.py`` holds them to it), so they use RE2
too: one engine, one guarantee. RE2's syntax is Python's without backreferences
and lookaround; ``\w \d \s \b`` are ASCII-only and ``\Z`` is spelled ``\z``
(https://github.com/google/re2/wiki/Syntax).

Searching is 13 times slower per call than ``re`` through google-re2's Python
wrapper, so a ``Screen`` first runs every pattern of a rule set over a line in
one pass (an RE2 set), and rules search only the lines their patterns matched:
classifying eight ranks of 300 lines takes 9 ms, where ``re`` took 43.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, Protocol

import re2


class RegexError(ValueError):
    """A pattern RE2 cannot compile; the message says why."""


class Match(Protocol):
    def groupdict(self) -> dict[str, Any]: ...


class Pattern(Protocol):
    """A compiled rule pattern: what matching needs of it."""

    @property
    def pattern(self) -> str: ...

    def search(self, text: str) -> Match | None: ...


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would also print every bad pattern to stderr
    return options


_OPTIONS = _options()


def _why(exc: Exception) -> str:
    said = exc.args[0] if exc.args else ""
    return said.decode(errors="replace") if isinstance(said, bytes) else str(said)


def compile_pattern(pattern: str) -> Pattern:
    try:
        compiled: Pattern = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raise RegexError(_why(exc)) from None
    return compiled


def encodable(line: str) -> str:
    """``line`` as RE2 can take it: UTF-8, which a lone surrogate (JSON may carry
    one, as ``\ud800``) cannot be encoded to."""
    if line.isascii():
        return line
    try:
        line.encode()
    except UnicodeEncodeError:
        return line.encode(errors="replace").decode()
    return line


@lru_cache(maxsize=16)
def _set(patterns: tuple[str, ...]) -> Any:
    """``patterns`` as one RE2 set; None if there are none, or too many for one set's
    memory bound (then each is searched on its own: slower, the same answers)."""
    if not patterns:
        return None
    found = re2.Set.SearchSet(_OPTIONS)
    try:
        for pattern in patterns:
            found.Add(pattern)
        found.Compile()
    except re2.error:
        return None
    return found


class Screen:
    """Which of a rule set's patterns match a line, all found in one pass over it:
    about 1 us a line for the 86 built-in patterns, where searching with each costs
    170 us (and with Python's ``re``, 16 us)."""

    def __init__(self, patterns: Iterable[Pattern]) -> None:
        self._patterns = tuple({p.pattern: p for p in patterns}.values())
        self._set = _set(tuple(p.pattern for p in self._patterns))

    def matches(self, line: str) -> frozenset[str]:
        """The text of every pattern that matches somewhere in ``line``."""
        line = encodable(line)
        if self._set is None:
            return frozenset(p.pattern for p in self._patterns if p.search(line) is not None)
        return frozenset(self._patterns[i].pattern for i in self._set.Match(line) or ())

    def search(self, line: str) -> bool:
        """Whether any pattern matches somewhere in ``line``."""
        return bool(self.matches(line))

    def index(self, lines: Sequence[str]) -> dict[str, list[int]]:
        """For each pattern (by its text) that matches any of ``lines``: which, ascending."""
        where: dict[str, list[int]] = {}
        for i, line in enumerate(lines):
            for text in self.matches(line):
                where.setdefault(text, []).append(i)
        return where
