"""The record every event of the daemon is: a name, typed fields, a version, a level.

A record class declares its fields as annotations (with ``from __future__ import
annotations`` they stay strings: nothing is evaluated, so a hundred classes import in
a few milliseconds where as many dataclasses would cost a tenth of a second). The
class keywords give the event's name, level, version and quiet fields; the docstring's
first line is what the event means to an operator (the reference shows it).

``typing.dataclass_transform`` tells the type checker that each subclass has a
keyword-only ``__init__`` of its fields, so ``RankExited(generation=1, rank=3)`` is
checked statically; at run time one generic ``__init__`` checks the names.

A field with a default is optional. A record remembers which fields it was given:
those are what it encodes, so an emit site that leaves an optional field out writes
no key for it (as the string form did), and one that passes None writes null.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple, dataclass_transform

# logging's numbers: the core imports no logging
DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40
LEVEL_NAMES = {DEBUG: "DEBUG", INFO: "INFO", WARNING: "WARNING", ERROR: "ERROR"}

HEADER = ("t_wall", "t_mono")  # written by the event log after the name, before the common fields
VERSION_KEY = "v"  # written only by versions after the first: every line of a v1 event lacks it


_NO_DEFAULT: Any = object()  # marks a field without a default while a class is read


class Field(NamedTuple):
    name: str
    type: str  # as annotated: the reference prints it
    optional: bool
    default: Any


@dataclass_transform(kw_only_default=True, frozen_default=True)
class Event:  # noqa: PLW1641 (unhashable: fields hold lists and dicts)
    """One event of the daemon's event log (a subclass per event name)."""

    NAME: ClassVar[str] = ""
    TOPIC: ClassVar[str] = ""  # the catalogue module that defines it
    VERSION: ClassVar[int] = 1
    LEVEL: ClassVar[int] = INFO
    QUIET: ClassVar[tuple[str, ...]] = ()  # bulky fields kept off the console
    # per older version, the fields it named otherwise: {1: {"old": "new"}} upgrades a v1 line
    RENAMED: ClassVar[Mapping[int, Mapping[str, str]]] = {}
    FIELDS: ClassVar[tuple[Field, ...]] = ()
    _NAMES: ClassVar[frozenset[str]] = frozenset()
    _REQUIRED: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(
        cls,
        *,
        name: str,
        level: int = INFO,
        version: int = 1,
        quiet: tuple[str, ...] = (),
        renamed: Mapping[int, Mapping[str, str]] | None = None,
    ) -> None:
        super().__init_subclass__()
        fields = []
        # the class's own annotations, unevaluated: inspect.get_annotations would cost its import
        for fname, annotation in cls.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
            text = str(annotation)
            if text.startswith(("ClassVar", "typing.ClassVar")):
                continue
            if fname.isupper() or fname.startswith("_") or hasattr(Event, fname):
                raise TypeError(f"{cls.__name__}.{fname}: a field may not shadow the record's own names")
            default = cls.__dict__.get(fname, _NO_DEFAULT)
            optional = default is not _NO_DEFAULT
            fields.append(Field(fname, text, optional, default if optional else None))
        cls.NAME, cls.LEVEL, cls.VERSION, cls.QUIET = name, level, version, quiet
        cls.TOPIC = cls.__module__.rpartition(".")[2]
        cls.RENAMED = renamed or {}
        cls.FIELDS = tuple(fields)
        cls._NAMES = frozenset(f.name for f in fields)
        cls._REQUIRED = frozenset(f.name for f in fields if not f.optional)
        unknown = set(quiet) - cls._NAMES
        if unknown:
            raise TypeError(f"{cls.__name__}: quiet names no field: {sorted(unknown)}")

    def __init__(self, **values: Any) -> None:
        cls = type(self)
        missing = cls._REQUIRED - values.keys()
        unknown = values.keys() - cls._NAMES
        if missing or unknown:
            raise TypeError(
                f"{cls.__name__}: missing fields {sorted(missing)}, unknown fields {sorted(unknown)}"
            )
        # the given fields live in the instance; an optional one left out reads the class default
        self.__dict__.update(values)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def values(self) -> dict[str, Any]:
        """The given fields, in declared order: what the event log writes."""
        given = self.__dict__
        return {f.name: given[f.name] for f in self.FIELDS if f.name in given}

    @property
    def extra(self) -> dict[str, Any]:
        """Keys a decoded line had that this version does not declare (kept, not an error)."""
        extra: dict[str, Any] = self.__dict__.get("_extra", {})
        return extra

    @property
    def head(self) -> dict[str, Any]:
        """A decoded line's t_wall, t_mono and common fields (run_id); empty when built in code."""
        head: dict[str, Any] = self.__dict__.get("_head", {})
        return head

    def as_dict(self, *, defaults: bool = True) -> dict[str, Any]:
        """The line as a reader sees it: name, head, the fields as written (renamed ones
        upgraded), extras, and (``defaults``) each optional field the line left out."""
        out: dict[str, Any] = {"event": self.NAME, **self.head}
        # the instance holds the given fields in the order written (or passed)
        out.update((k, v) for k, v in self.__dict__.items() if not k.startswith("_"))
        for key, value in self.extra.items():
            out.setdefault(key, value)
        if defaults:
            for f in self.FIELDS:
                if f.optional:
                    out.setdefault(f.name, f.default)
        return out

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.__dict__ == other.__dict__

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.values().items())
        return f"{type(self).__name__}({shown})"


class Unknown:
    """A line whose event name the catalogue does not know (a newer daemon's, a typo):
    kept whole, so a reader can show it or pass it on."""

    def __init__(self, name: str, fields: dict[str, Any], head: dict[str, Any]) -> None:
        self.NAME = name
        self.fields = fields
        self.head = head

    def as_dict(self, *, defaults: bool = True) -> dict[str, Any]:
        """The line as it was (there are no defaults to fill for an unknown event)."""
        return {"event": self.NAME, **self.head, **self.fields}

    def __repr__(self) -> str:
        return f"Unknown({self.NAME!r}, {self.fields!r})"
