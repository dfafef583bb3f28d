"""The readers of event logs go through the catalogue: an older daemon's renamed field
reads under today's name, an unknown event or field is kept, a malformed line skipped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli.control import _print_event
from supervisor.core.catalogue.ranks import RankHung
from supervisor.postmortem.runlog import read_run
from supervisor.runreport.reader import parse_lines

HUNG_V1 = {"event": "rank_hung", "t_wall": 5.0, "t_mono": 1.0, "run_id": "r", "generation": 0, "rank": 1,
           "kind": "heartbeat", "late": 0.25}  # fmt: skip


@pytest.fixture
def renamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if rank_hung's ``late_by`` had been called ``late`` in version 1."""
    monkeypatch.setattr(RankHung, "VERSION", 2)
    monkeypatch.setattr(RankHung, "RENAMED", {1: {"late": "late_by"}})


def _lines(*events: dict[str, Any]) -> list[bytes]:
    return [json.dumps(e).encode() for e in events]


def test_the_report_reads_an_older_line_under_todays_names(renamed: None) -> None:
    future = {"event": "from_a_newer_daemon", "t_wall": 6.0, "x": 1}
    events, skipped = parse_lines([*_lines(HUNG_V1, future), b'{"event": "rank_hu'], Path("events.jsonl"))
    assert [s.why for s in skipped] == ["truncated"]
    hung, kept = events
    assert hung["late_by"] == 0.25 and "late" not in hung
    assert "waiting" not in hung  # a required field the line lacks is never invented
    assert kept == future


def test_the_report_fills_an_optional_field_a_line_left_out() -> None:
    line = {"event": "containment", "t_wall": 1.0, "mode": "cgroup", "cgroup": "/g", "kill": "cgroup.kill"}
    (event,), _ = parse_lines(_lines(line), Path("events.jsonl"))
    assert event["why"] is None and event["generation"] is None and event["cgroup"] == "/g"


def test_the_post_mortem_reads_an_older_line_under_todays_names(renamed: None, tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_bytes(b"\n".join([*_lines(HUNG_V1), b"not json", b"[]"]) + b"\n")
    run = read_run(tmp_path)
    assert run.generations[0].hangs[1]["late_by"] == 0.25


def test_the_events_command_prints_todays_names_and_the_fields_as_written(
    renamed: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _print_event(json.dumps(HUNG_V1).encode(), False, 0.0) == 1.0
    shown = capsys.readouterr().out
    # a person's sentence, from the fields under today's names
    assert "rank_hung: rank 1: heartbeat open" in shown and "noticed 0.25 s late" in shown, shown
    assert "section" not in shown  # nothing filled in that the line did not say
    assert _print_event(b"{truncated", False, 0.0) == 0.0  # skipped, as before
    assert _print_event(b'{"t_mono": 2.0, "x": 1}', False, 0.0) == 2.0  # no name: printed as it is
