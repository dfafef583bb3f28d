"""A node's health ledger across runs, and its quarantine: pure rules."""

from __future__ import annotations

import pytest

from supervisor.config.errors import ConfigError
from supervisor.config.health import quarantine_of
from supervisor.core.health import KEEP, KEEP_FOR, Ledger, Mark, Quarantine, mark_of, quarantined, screen
from supervisor.core.types import Action, Decision, Reason

HOUR = 3600.0
RESTART = Decision(Action.RESTART, Reason.RANK_FAILED, "rank 1: ECC")


def _mark(at: float, rule: str = "C3") -> Mark:
    return Mark(at, "hardware", rule, "uncorrectable ECC error", run_id="r", generation=0)


@pytest.mark.parametrize(
    ("text", "count", "window"),
    [("3/24h", 3, 86400.0), (" 1 / 90 ", 1, 90.0), ("2/1h30m", 2, 5400.0)],
)
def test_a_threshold_is_count_per_window(text: str, count: int, window: float) -> None:
    assert quarantine_of(text) == Quarantine(count, window)


@pytest.mark.parametrize("text", ["3", "x/1h", "0/1h", "3/", "3/soon", "3/-1h", "3/0s", "3/nan"])
def test_a_bad_threshold_is_named(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--node-quarantine .*(COUNT|duration|least|more than|negative)"):
        quarantine_of(text)


def test_only_hardware_and_unkillable_ranks_leave_a_mark() -> None:
    assert mark_of(RESTART, "hardware", "C3", now=5.0, run_id="r", generation=2) == Mark(
        5.0, "hardware", "C3", "rank 1: ECC", run_id="r", generation=2
    )
    stuck = Decision(Action.RESCHEDULE, Reason.RANK_UNKILLABLE, "rank 0 survived SIGKILL")
    unkillable = mark_of(stuck, None, None, now=5.0, run_id="r", generation=0)
    assert unkillable is not None and unkillable.kind == "unkillable"
    for nature in ("transient", "deterministic", None):
        assert mark_of(RESTART, nature, "P1", now=5.0, run_id="r", generation=0) is None


def test_the_threshold_counts_marks_within_the_window() -> None:
    rule = Quarantine(2, HOUR)
    ledger = Ledger().add(_mark(0.0))
    assert quarantined(ledger, rule, 10.0) is None
    ledger = ledger.add(_mark(HOUR / 2, "X79"))
    refused = quarantined(ledger, rule, HOUR)
    assert refused is not None
    assert (refused.action, refused.reason) == (Action.RESCHEDULE, Reason.NODE_QUARANTINED)
    assert "2 hardware-looking failure(s) within 1h (C3, X79; --node-quarantine 2/1h)" in refused.detail
    assert quarantined(ledger, rule, 2 * HOUR) is None  # the first one aged out of the window
    assert quarantined(ledger, None, HOUR) is None  # no threshold: kept, never enforced


def test_a_restart_that_crosses_the_threshold_becomes_the_nodes_leaving() -> None:
    rule = Quarantine(1, HOUR)
    ledger = Ledger().add(_mark(0.0))
    assert screen(RESTART, ledger, rule, 1.0).reason is Reason.NODE_QUARANTINED
    abort = Decision(Action.ABORT, Reason.NOT_RETRYABLE, "bug")
    assert screen(abort, ledger, rule, 1.0) is abort  # an abort stays an abort
    assert screen(RESTART, Ledger(), rule, 1.0) is RESTART


def test_the_ledger_is_bounded_and_reads_what_it_can() -> None:
    now = KEEP_FOR * 2
    ledger = Ledger()
    for i in range(KEEP + 10):
        ledger = ledger.add(_mark(now - KEEP - 10 + i))
    assert len(ledger.marks) == KEEP and ledger.marks[-1].at == now - 1
    old = Ledger().add(_mark(0.0)).add(_mark(now))
    assert [m.at for m in old.marks] == [now]  # older than KEEP_FOR: forgotten
    raw = {"marks": [_mark(now).to_json(), {"at": "yesterday"}, 7, {"at": float("nan"), "kind": "x"},
                     {**_mark(now).to_json(), "generation": True, "detail": "d" * 10_000}]}  # fmt: skip
    read = Ledger.from_json(raw, now)
    assert len(read.marks) == 2 and read.marks[1].generation is None and len(read.marks[1].detail) == 300
    assert Ledger.from_json([1, 2], now) == Ledger() == Ledger.from_json({"marks": "no"}, now)
