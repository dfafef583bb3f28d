"""Write docs/reference/events.md from the event catalogue (supervisor.core.catalogue).

    python scripts/gen_event_reference.py

``tests/unit/test_event_reference.py`` fails while the file and the catalogue differ.
"""

from __future__ import annotations

from pathlib import Path

from supervisor.core.catalogue import CATALOGUE, LEVEL_NAMES, TOPICS, Event

TARGET = Path(__file__).resolve().parent.parent / "docs" / "reference" / "events.md"

INTRO = """\
# Events

<!-- written by scripts/gen_event_reference.py from supervisor/core/catalogue: do not edit -->

The daemon writes one JSON line per event to `events.jsonl` in its run directory, and
publishes each on its events socket (`ft-supervisor events --follow`). Every line is

```json
{"event": "<name>", "t_wall": <unix s>, "t_mono": <CLOCK_MONOTONIC s>, "run_id": "<id>", ...fields}
```

in that order. An event past its first version also carries `"v": <version>` after
`t_mono`; a line without it is version 1. A field marked *optional* may be absent
from a line (readers fill in its default, null); any other field is always written,
though its value may be null where its type says so. Readers ignore fields they do not
know, so fields may be added without a new version; a renamed field makes one.

The level is the one the console shows by default (some events are logged at another
level when they say something worse or milder). Fields in *quiet* stay off the
console: they are bulky text, kept in the event log.

{count} events.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _fields(cls: type[Event]) -> str:
    shown = []
    for f in cls.FIELDS:
        text = f"`{f.name}` {_cell(f.type)}"
        if f.optional:
            text += " *optional*"
        if f.name in cls.QUIET:
            text += " *quiet*"
        shown.append(text)
    return "<br>".join(shown) or "-"


def describe(cls: type[Event]) -> str:
    """The first line of the record's docstring: what the event means to an operator."""
    return (cls.__doc__ or "").strip().split("\n", 1)[0].strip()


def render() -> str:
    out = [INTRO.replace("{count}", str(len(CATALOGUE)))]
    for topic, title in TOPICS.items():
        records = sorted((c for c in CATALOGUE.values() if topic == c.TOPIC), key=lambda c: c.NAME)
        out.append(f"\n## {title}\n\n| event | level | version | fields | meaning |\n|---|---|---|---|---|\n")
        for cls in records:
            level = LEVEL_NAMES.get(cls.LEVEL, str(cls.LEVEL))
            meaning = _cell(describe(cls))
            out.append(f"| `{cls.NAME}` | {level} | {cls.VERSION} | {_fields(cls)} | {meaning} |\n")
    return "".join(out)


def main() -> int:
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(render())
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
