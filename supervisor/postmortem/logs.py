"""Reading logs of any size in one pass, keeping only what a rule could need.

``scan`` keeps the lines worth classifying (one of ``supervisor.core.notable``'s
keywords, or a match of ``extra``: the user's rules, a launcher's structure
lines), bounded: the first ``KEEP_FIRST`` and the latest ``KEEP_LAST``, plus the
last ``TAIL`` lines. A 100 MB log costs one pass and little memory.

A file given on its own is told apart here: a launcher's log (torchrun's,
ft_launcher's, or a mix of several ranks' output) is split into ranks by
``supervisor.core.agentlog``; one rank's log is named by its ``[rankN]:`` prefixes.
The daemon's own readings (the log tail, the error file) are repeated here the
way ``supervisor.process.evidence`` does them, so that a run directory read
offline yields the evidence the daemon had.
"""

from __future__ import annotations

import codecs
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.core.agentlog import STRUCTURE, is_launcher_log
from supervisor.core.notable import KEYWORDS, notable_lines
from supervisor.core.patterns import Screen
from supervisor.core.rules import strip_prefix

CHUNK = 4 << 20
KEEP_FIRST = 64
KEEP_LAST = 448
TAIL = 40
LINE_MAX = 4096
_PREFIXED = re.compile(r"^\s*\[rank(\d+)\]:")

Numbered = tuple[int, str]  # (line number, line)


@dataclass
class _Kept:
    first: list[Numbered]
    latest: deque[Numbered]
    tail: deque[Numbered]

    def add(self, numbered: Numbered) -> None:
        line = (numbered[0], numbered[1][:LINE_MAX])
        (self.first if len(self.first) < KEEP_FIRST else self.latest).append(line)


def _scan(
    path: Path, extra: Screen | None, words: tuple[str, ...] = KEYWORDS, *, end: int | None = None
) -> _Kept:
    kept = _Kept([], deque(maxlen=KEEP_LAST), deque(maxlen=TAIL))
    carry = ""
    number = 0
    left = end
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a chunk may cut a character
    with path.open("rb") as f:
        while raw := f.read(CHUNK if left is None else min(CHUNK, left)):
            if left is not None:
                left -= len(raw)
            chunk = decoder.decode(raw)
            text = carry + chunk
            cut = text.rfind("\n") + 1
            text, carry = text[:cut], text[cut:]
            if len(carry) > LINE_MAX * 16:  # a runaway line: keep its start only
                text, carry = text + carry[:LINE_MAX] + "\n", ""
            number = _keep(text, number, extra, words, kept)
    if carry:
        _keep(carry + "\n", number, extra, words, kept)
    return kept


def _keep(text: str, number: int, extra: Screen | None, words: tuple[str, ...], kept: _Kept) -> int:
    """Keep ``text``'s lines worth classifying (complete lines, the first numbered
    ``number``) and its last lines; the number of the line after it."""
    count = text.count("\n")
    if extra is None:
        for numbered in _located(notable_lines(text, words), text, number):
            kept.add(numbered)
    else:  # a regex per line: slower than the keyword search, as the user's rules are
        notable = set(notable_lines(text, words))
        for i, line in enumerate(text.split("\n")[:count]):
            if line in notable or extra.search(line):
                kept.add((number + i, line))
    last = text[-TAIL * LINE_MAX :].split("\n")[:-1][-TAIL:]
    kept.tail.extend((number + count - len(last) + i, line) for i, line in enumerate(last))
    return number + count


def _located(lines: list[str], text: str, number: int) -> list[Numbered]:
    """The line numbers of ``lines`` (whole lines of ``text``, in order)."""
    hay = "\n" + text
    out = []
    pos = counted = 0
    newlines = -1  # the newline put before the text is not one of its own
    for line in lines:
        at = hay.find(f"\n{line}\n", pos)
        if at < 0:  # split at a rarer line break than \n: keep it, numbered as the line before
            out.append((number + max(newlines, 0), line))
            continue
        # up to and with the newline that ends the line before: adjacent lines differ by one
        newlines += hay.count("\n", counted, at + 1)
        counted = pos = at + 1
        out.append((number + newlines, line))
    return out


def scan(
    path: Path, extra: Screen | None = None, *, end: int | None = None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the lines worth classifying: the first ones and the latest, bounded; the last lines),
    of the first ``end`` bytes (None: all)."""
    kept = _scan(path, extra, end=end)
    return tuple(line for _, line in (*kept.first, *kept.latest)), tuple(line for _, line in kept.tail)


@dataclass(frozen=True, slots=True)
class LogFile:
    """A log given on its own: a launcher's, or one rank's."""

    launcher: bool
    rank: int | None  # named by its [rankN]: prefixes; None: none, or several
    lines: tuple[str, ...]  # the kept and the last lines in order
    notable: tuple[str, ...] = ()  # a rank's: the kept lines...
    tail: tuple[str, ...] = ()  # ...and its last ones
    # several ranks' lines and no launcher's (a console without --redirects): whose each is
    owners: dict[str, int] = field(default_factory=dict)

    def owner(self, line: str) -> int | None:
        """The rank whose line this is (prefix removed, as the rules see it)."""
        return self.rank if not self.owners else self.owners.get(line)


def read_log(path: Path, extra: Screen | None = None) -> LogFile:
    kept = _scan(path, extra, KEYWORDS + STRUCTURE)
    merged = tuple(dict(sorted((*kept.first, *kept.latest, *kept.tail))).values())
    if is_launcher_log(merged):
        return LogFile(True, None, merged)
    owners = {strip_prefix(line): int(m.group(1)) for line in merged if (m := _PREFIXED.match(line))}
    ranks = set(owners.values())
    return LogFile(
        False,
        next(iter(ranks)) if len(ranks) == 1 else None,
        merged,
        notable=tuple(line for _, line in (*kept.first, *kept.latest)),
        tail=tuple(line for _, line in kept.tail),
        owners=owners if len(ranks) > 1 else {},
    )
