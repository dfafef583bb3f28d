"""docs/reference/events.md is the catalogue's, current, and every event in it says what it means."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from supervisor.core.catalogue import CATALOGUE, TOPICS

ROOT = Path(__file__).parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_event_reference", ROOT / "scripts" / "gen_event_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_is_current() -> None:
    written = (ROOT / "docs" / "reference" / "events.md").read_text()
    assert written == _script().render(), "stale: run python scripts/gen_event_reference.py"


def test_every_event_has_a_row_with_its_meaning() -> None:
    script = _script()
    text = script.render()
    for name, cls in CATALOGUE.items():
        assert cls.TOPIC in TOPICS, f"{name}: topic {cls.TOPIC} has no section"
        meaning = script.describe(cls)
        assert meaning and meaning.endswith((".", ")")), f"{name} lacks a one-line description"
        assert f"| `{name}` |" in text
