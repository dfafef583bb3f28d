"""The event catalogue: the records, their encoding by the event log, and decoding."""

from __future__ import annotations

import ast
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from supervisor.core.catalogue import CATALOGUE, LEVEL_NAMES, NotAnEvent, Unknown, decode, envelope
from supervisor.core.catalogue.base import WARNING, Event
from supervisor.core.catalogue.checkpoints import CheckpointSyncFailed
from supervisor.core.catalogue.generation import Containment, ForkServer, KernelLines
from supervisor.core.catalogue.ranks import RankExited, RankExitStuck
from supervisor.runtime.records.events import EventLog

SUPERVISOR = Path(__file__).parents[2] / "supervisor"
LIFECYCLE = SUPERVISOR / "runtime" / "lifecycle"


def _emit_calls() -> list[tuple[Path, int, ast.Call]]:
    found = []
    for path in sorted(SUPERVISOR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "emit"
            ):
                found.append((path, node.lineno, node))
    return found


def _string_form(call: ast.Call) -> bool:
    """An emit by name: a string (or f-string) first, or the fields as keywords."""
    first = call.args[0] if call.args else None
    literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
    return literal or isinstance(first, ast.JoinedStr) or bool(call.keywords)


STRING_EMIT = re.compile(r"""emit\(\s*f?["']""")


def test_no_event_is_emitted_by_a_string_name() -> None:
    calls = _emit_calls()
    assert len(calls) > 90  # the scan sees the daemon's emit sites, the lifecycle's among them
    assert sum(1 for p, _, _ in calls if LIFECYCLE in p.parents) > 60
    strings = [f"{p.relative_to(SUPERVISOR)}:{n}" for p, n, c in calls
               if p.name != "log.py" and _string_form(c)]  # fmt: skip
    assert strings == []
    # and anywhere in the text: an emit the scan of calls could miss (a docstring's example too)
    text = [str(p.relative_to(SUPERVISOR)) for p in SUPERVISOR.rglob("*.py")
            if STRING_EMIT.search(p.read_text())]  # fmt: skip
    assert text == []


def test_each_record_says_what_it_means_and_is_consistent() -> None:
    assert len(CATALOGUE) >= 90
    for name, cls in CATALOGUE.items():
        assert name == cls.NAME
        assert (cls.__doc__ or "").strip(), f"{name} has no description"
        assert cls.LEVEL in LEVEL_NAMES and cls.VERSION >= 1 and cls.TOPIC
        assert set(cls.QUIET) <= {f.name for f in cls.FIELDS}


def test_a_record_checks_its_fields_and_is_immutable() -> None:
    with pytest.raises(TypeError, match="missing"):
        RankExited(generation=1, rank=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unknown"):
        KernelLines(generation=1, lines=[], bogus=1)  # type: ignore[call-arg]
    record = KernelLines(generation=1, lines=["Xid 79"])
    with pytest.raises(AttributeError):
        record.generation = 2  # type: ignore[misc]
    assert record == KernelLines(generation=1, lines=["Xid 79"]) and record.QUIET == ("lines",)


def test_a_field_may_not_shadow_the_records_own_names() -> None:
    with pytest.raises(TypeError, match="shadow"):

        class Bad(Event, name="bad"):
            """bad"""

            values: int  # type: ignore[assignment]


class _Clock:
    def wall(self) -> float:
        return 1700000000.25

    def monotonic(self) -> float:
        return 12.5


def _log(tmp_path: Path, name: str = "events.jsonl") -> EventLog:
    return EventLog(tmp_path / name, logging.getLogger("test-catalogue"), _Clock(), run_id="r1")  # type: ignore[arg-type]


def test_a_record_writes_the_line_the_string_form_wrote(tmp_path: Path) -> None:
    log = _log(tmp_path)
    # fields left out stay out, a None given is null, the order is the catalogue's (the sites')
    log.emit(Containment(generation=3, mode="fallback", why="no cgroup v2"), logging.WARNING)
    log.emit(ForkServer(mode="on", pid=7, modules=["torch"], seconds=1.5))
    stuck: dict[str, Any] = {"generation": 1, "after": "failure_reported", "rank": 2, "pid": 9, "waited": 3.0}
    log.emit(RankExitStuck(**stuck))
    fields: dict[str, Any] = {"phase": "sync", "error": "gone", "dest": "s3://b"}
    log.emit(CheckpointSyncFailed(**fields))
    log.emit(RankExitStuck(generation=1, after="peers_succeeded", native_error=None, rank=2, pid=9,
                           waited=3.0))  # fmt: skip
    log.close()
    head = [("t_wall", 1700000000.25), ("t_mono", 12.5), ("run_id", "r1")]
    lines = [list(json.loads(line).items()) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert lines == [
        [("event", "containment"), *head, ("generation", 3), ("mode", "fallback"), ("why", "no cgroup v2")],
        [("event", "fork_server"), *head, ("mode", "on"), ("pid", 7), ("modules", ["torch"]),
         ("seconds", 1.5)],
        [("event", "rank_exit_stuck"), *head, *stuck.items()],
        [("event", "checkpoint_sync_failed"), *head, *fields.items()],
        [("event", "rank_exit_stuck"), *head, ("generation", 1), ("after", "peers_succeeded"),
         ("native_error", None), ("rank", 2), ("pid", 9), ("waited", 3.0)],
    ]  # fmt: skip


def test_the_records_level_and_quiet_fields_reach_the_console(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = _log(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="test-catalogue"):
        log.emit(KernelLines(generation=0, lines=["a" * 100]))
        log.emit(CheckpointSyncFailed(phase="final", error="late", dest="d"))
        log.emit(CheckpointSyncFailed(phase="restore", error="x", dest="d"), logging.ERROR)
    log.close()
    levels = [(r.getMessage(), r.levelno) for r in caplog.records]
    assert levels == [("kernel_lines", logging.INFO), ("checkpoint_sync_failed", WARNING),
                      ("checkpoint_sync_failed", logging.ERROR)]  # fmt: skip
    assert caplog.records[0].fields == {"generation": 0}  # type: ignore[attr-defined]
    assert json.loads((tmp_path / "events.jsonl").read_text().splitlines()[0])["lines"] == ["a" * 100]


def test_the_event_log_takes_records_only(tmp_path: Path) -> None:
    log = _log(tmp_path)
    with pytest.raises(TypeError, match="catalogue record"):
        log.emit("kernel_lines")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        log.emit(KernelLines(generation=0, lines=[]), rank=1)  # type: ignore[call-arg]
    log.close()
    assert (tmp_path / "events.jsonl").read_bytes() == b""


def test_decode_reads_a_line_back_into_its_record() -> None:
    line = envelope(RankExited(generation=1, rank=3, local_rank=3, pid=40, exit_code=None, signal="SIGKILL",
                               state="failed", standby=None, stdout_bytes=None, stderr_bytes=10),
                    1.0, 2.0, {"run_id": "r1"})  # fmt: skip
    record = decode(json.dumps(line))
    assert isinstance(record, RankExited)
    assert record.signal == "SIGKILL" and record.head == {"t_wall": 1.0, "t_mono": 2.0, "run_id": "r1"}
    assert record.as_dict() == line


def test_decode_keeps_what_it_does_not_know_and_defaults_what_is_missing() -> None:
    unknown = decode({"event": "from_the_future", "t_wall": 1.0, "x": 1})
    assert isinstance(unknown, Unknown) and unknown.as_dict() == {
        "event": "from_the_future",
        "t_wall": 1.0,
        "x": 1,
    }
    record = decode({"event": "containment", "t_wall": 1.0, "mode": "cgroup", "cgroup": "/g", "later": [1]})
    assert isinstance(record, Containment)
    assert record.extra == {"later": [1]} and record.why is None and record.generation is None
    assert record.as_dict()["why"] is None and "why" not in record.as_dict(defaults=False)
    assert record.as_dict(defaults=False) == {"event": "containment", "t_wall": 1.0, "mode": "cgroup",
                                              "cgroup": "/g", "later": [1]}  # fmt: skip
    # a damaged line that lacks a required field: read, never invented, never a crash
    partial = decode({"event": "rank_exited", "rank": 1})
    assert partial.as_dict() == {"event": "rank_exited", "rank": 1}


@pytest.mark.parametrize("line", [b"", b"{", b"[1]", b'{"event": 3}', b'{"no": "name"}', "\xff"])
def test_what_is_not_an_event_is_said_in_one_line(line: bytes | str) -> None:
    with pytest.raises(NotAnEvent) as raised:
        decode(line)
    assert "\n" not in str(raised.value)


class Saved(Event, name="saved", version=3, renamed={1: {"secs": "duration"}, 2: {"duration": "seconds"}}):
    """A synthetic event whose field was renamed twice: secs (v1), duration (v2), seconds (v3)."""

    seconds: float
    path: str | None = None


def test_an_older_version_is_upgraded_to_todays_names() -> None:
    table = {Saved.NAME: Saved}
    for version, old in ((1, "secs"), (2, "duration")):
        line: dict[str, Any] = {"event": "saved", "t_wall": 1.0, old: 4.5}
        if version > 1:
            line["v"] = version
        record = decode(line, table)
        assert isinstance(record, Saved) and record.seconds == 4.5 and record.extra == {}
    current = decode({"event": "saved", "v": 3, "seconds": 1.0, "duration": "an extra of today"}, table)
    assert (
        isinstance(current, Saved)
        and current.seconds == 1.0
        and current.extra == {"duration": "an extra of today"}
    )
    # a line of a later version is read as it is
    assert decode({"event": "saved", "v": 9, "seconds": 2.0}, table).as_dict()["seconds"] == 2.0
    # and today's records say their version on the line
    assert envelope(Saved(seconds=1.0), 1.0, 2.0, {})["v"] == 3
    assert "v" not in envelope(KernelLines(generation=0, lines=[]), 1.0, 2.0, {})
