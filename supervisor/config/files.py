"""Reading a config or rules file, within bounds.

Every file the daemon reads, at start and on SIGHUP (``--ft-cfg-path``,
``--rules``), comes through here, so that no file can wedge or kill it
(every input the daemon reads is bounded):

* at most ``MAX_BYTES`` (1 MiB; a real config is a few kilobytes, and a MiB of
  YAML takes 2-4 s to parse on a slow core: a 100 MB file took minutes);
* a regular file: opening a FIFO would block until someone writes to it;
* UTF-8: a byte that is not is named with its offset;
* YAML without anchors or aliases: ``a: &a [*a]`` is a list that holds itself,
  and a 529-byte "billion laughs" file is 10^9 nodes to whoever walks it; no
  nvidia-resiliency-ext config needs them;
* nested at most ``MAX_DEPTH`` levels: the parsers recurse once per level, and
  so does whatever prints a value.

A file that cannot be used raises ``ConfigError`` with a one-line message
that does not name the file (the caller names it the way its option does); one
that cannot be opened or read raises the ``OSError``.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal

import re2

from supervisor.config.errors import ConfigError

MAX_BYTES = 1 << 20  # 1 MiB
MAX_DEPTH = 64

Kind = Literal["yaml", "toml"]


def read(path: Path, kind: Kind) -> object:
    """The document in ``path``: plain dicts, lists and scalars, a tree at most
    ``MAX_DEPTH`` deep."""
    return parse(_read_bytes(path), kind)


def parse(data: bytes, kind: Kind) -> object:
    if len(data) > MAX_BYTES:
        raise ConfigError(f"larger than {MAX_BYTES} bytes (1 MiB), the limit for a config or rules file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start}") from None
    text = text.removeprefix("\ufeff")  # a byte-order mark some editors write
    doc = _toml(text) if kind == "toml" else _yaml(text)
    if _depth_exceeds(doc, MAX_DEPTH):
        raise ConfigError(f"not valid {kind.upper()}: nested deeper than {MAX_DEPTH} levels")
    return doc


def _read_bytes(path: Path) -> bytes:
    # O_NONBLOCK: a FIFO opens at once instead of waiting for a writer (and is refused below)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError("not a regular file")
        with open(fd, "rb", closefd=False) as f:
            return f.read(MAX_BYTES + 1)  # one byte more tells a file over the limit
    finally:
        os.close(fd)


def _one_line(exc: BaseException) -> str:
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if problem and mark is not None:  # a YAML error: pyyaml's own text spans several lines
        context = getattr(exc, "context", None)
        said = f"{context}, {problem}" if context else problem
        return f"{said} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split()) or type(exc).__name__


# TOML's strings and comments, as a tokenizer sees them (leftmost first, the
# multi-line forms before the one-line ones; a run of 3-5 quotes closes a
# multi-line string, the extra ones being its content); RE2: linear, whatever the file
_TOML_ATOMS: Any = re2.compile(
    r'(?s:"""(?:[^"\\]|\\.|""?(?:[^"\\]|\\.))*"{3,5})'
    r"|(?s:'''(?:[^']|''?[^'])*'{3,5})"
    r'|"(?:[^"\\\n]|\\.)*"'
    r"|'[^'\n]*'"
    r"|#[^\n]*"
)
_KEY_RUN = re.compile(r"[A-Za-z0-9_.\- \t]+")  # one character class: linear in ``re`` too


def _longest_dotted_key(text: str) -> int:
    """At least the parts of the longest dotted key (``a.b."c"``) in ``text``: strings
    become one character, and dots are counted in runs of what keys are made of."""
    if text.count(".") < MAX_DEPTH:
        return text.count(".") + 1
    keys = _TOML_ATOMS.sub("x", text)
    return max((run.count(".") + 1 for run in _KEY_RUN.findall(keys)), default=1)


def _toml(text: str) -> object:
    # tomllib takes time quadratic in the parts of one dotted key (a 1 MiB key of
    # 500,000 parts: most of an hour); more than MAX_DEPTH parts nest too deep anyway
    if _longest_dotted_key(text) > MAX_DEPTH:
        raise ConfigError(f"not valid TOML: a dotted key of more than {MAX_DEPTH} parts")
    try:
        return tomllib.loads(text)
    except RecursionError:  # tomllib recurses per nested array or inline table
        raise ConfigError(f"not valid TOML: nested deeper than {MAX_DEPTH} levels") from None
    # a parser is third-party code reading an untrusted file: whatever it raises
    # (TOMLDecodeError, ValueError for a 5000-digit integer...) means the file is bad
    except Exception as exc:
        raise ConfigError(f"not valid TOML: {_one_line(exc)}") from None


def _yaml(text: str) -> object:
    try:
        loader = _loader()(text)  # pyyaml's own reader checks the characters here
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except Exception as exc:  # as for TOML: anything the parser raises is the file's fault
        if "maximum nesting depth" in str(exc):  # libyaml 0.2.6+ stops at 1000 levels, before us
            raise ConfigError(f"not valid YAML: nested deeper than {MAX_DEPTH} levels") from None
        raise ConfigError(f"not valid YAML: {_one_line(exc)}") from None


@cache
def _loader() -> type[Any]:
    """pyyaml's safe loader, refusing anchors, aliases and nesting past ``MAX_DEPTH``.

    Built on first use (pyyaml is imported only when a YAML file is given). With
    libyaml present, its parser feeds pyyaml's composer: the composer is where
    anchors are seen and levels counted (libyaml's own composer cannot be hooked),
    and the pair reads a 1 MiB file 3-4 times faster than pyyaml alone.
    """
    import yaml  # noqa: PLC0415
    from yaml.composer import Composer, ComposerError  # noqa: PLC0415
    from yaml.constructor import SafeConstructor  # noqa: PLC0415
    from yaml.resolver import Resolver  # noqa: PLC0415

    class Refusing(Composer):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event: Any = self.peek_event()  # type: ignore[attr-defined]  # the parser mixed in below
            if isinstance(event, yaml.AliasEvent):
                self._refuse(f"alias *{event.anchor}: anchors and aliases are not accepted", event)
            if getattr(event, "anchor", None) is not None:
                self._refuse(f"anchor &{event.anchor}: anchors and aliases are not accepted", event)
            nests = isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent)
            if nests and self.depth >= MAX_DEPTH:  # containers count, as in _depth_exceeds
                self._refuse(f"nested deeper than {MAX_DEPTH} levels", event)
            self.depth += nests
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= nests

        @staticmethod
        def _refuse(problem: str, event: Any) -> None:
            raise ComposerError(None, None, problem, event.start_mark)

    if not yaml.__with_libyaml__:

        class PureLoader(Refusing, yaml.SafeLoader):
            pass

        return PureLoader

    from yaml._yaml import CParser  # noqa: PLC0415

    class FastLoader(Refusing, CParser, SafeConstructor, Resolver):
        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    return FastLoader


def _depth_exceeds(doc: object, limit: int) -> bool:
    """Whether containers nest deeper than ``limit``: without recursion (TOML's dotted
    keys make any depth without the parser recursing), and each container once."""
    stack: list[tuple[object, int]] = [(doc, 0)]
    seen: set[int] = set()
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, Mapping | list) or id(node) in seen:
            continue
        if depth >= limit:
            return True
        seen.add(id(node))
        children = node.values() if isinstance(node, Mapping) else node
        stack.extend((child, depth + 1) for child in children)
    return False
