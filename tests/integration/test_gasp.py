"""The dying gasp: ranks with a save callback save before they are stopped."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

from tests.support import RANKS, Daemon, wait_until

SAVER = str(RANKS / "saver.py")
FAST = ("--nproc-per-node", "2", "--preload", "none")
Start = Callable[..., Daemon]


def _saved(where: Path, rank: int, gen: int = 0) -> dict[str, object]:
    data: dict[str, object] = json.loads((where / f"saved.{rank}.{gen}.json").read_text())
    return data


def test_a_crash_asks_the_survivor_to_save_before_the_restart(start: Start, tmp_path: Path) -> None:
    d = start(*FAST, "--max-restarts", "1", SAVER, "--dir", str(tmp_path), "--crash-rank", "1")
    assert d.wait() == 0, d.story()
    (asked,) = d.events("save_requested")
    assert asked["ranks"] == [0] and asked["generation"] == 0 and asked["why"] == "generation 0 failed"
    (finished,) = d.events("save_finished")
    assert finished["saved"] == [0] and finished["failed"] is None and finished["unanswered"] is None
    saved = _saved(tmp_path, 0)
    assert saved["reason"] == "generation 0 failed" and saved["deadline"] == 60.0
    assert not (tmp_path / "saved.1.0.json").exists()  # the crashed rank had nothing to save
    names = [e["event"] for e in d.events()]
    # saved first, stopped after: the survivor is signalled only once its save is done
    assert names.index("save_finished") < names.index("generation_ended")
    assert names.count("generation_started") == 2


def test_a_hung_rank_is_not_asked_to_save(start: Start, tmp_path: Path) -> None:
    d = start(*FAST, "--ft-initial-rank-heartbeat-timeout", "1", "--ft-rank-heartbeat-timeout", "1",
              SAVER, "--dir", str(tmp_path), "--hang-rank", "1")  # fmt: skip
    d.wait_event("rank_hung", where=lambda e: e["rank"] == 1)
    d.wait()
    (asked,) = d.events("save_requested")
    assert asked["ranks"] == [0]  # its state is in doubt, and it could hold the restart
    assert d.events("save_finished")[0]["saved"] == [0]
    assert not (tmp_path / "saved.1.0.json").exists()


def test_sigterm_waits_for_the_saves_then_stops(start: Start, tmp_path: Path) -> None:
    d = start(*FAST, SAVER, "--dir", str(tmp_path), "--save-seconds", "0.5")
    _registered(d, tmp_path)
    d.signal(signal.SIGTERM)
    assert d.wait() == 128 + signal.SIGTERM, d.stderr()
    (finished,) = d.events("save_finished")
    assert finished["saved"] == [0, 1] and finished["seconds"] >= 0.5
    for r in (0, 1):
        assert _saved(tmp_path, r)["reason"] == "stop requested (SIGTERM)"


def test_a_failing_or_slow_save_is_reported_and_does_not_hold_the_stop(start: Start, tmp_path: Path) -> None:
    d = start(*FAST, "--save-timeout", "1", SAVER, "--dir", str(tmp_path), "--save-seconds", "60",
              "--raise-rank", "0")  # fmt: skip
    _registered(d, tmp_path)
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 128 + signal.SIGTERM, d.stderr()
    (finished,) = d.events("save_finished")
    assert finished["saved"] == []
    assert finished["failed"] == {"0": "RuntimeError: disk full"}
    assert finished["unanswered"] == [1]
    assert 1.0 <= finished["seconds"] < 5.0


def _registered(d: Daemon, where: Path) -> None:
    wait_until(lambda: all((where / f"ready.{r}.0").exists() for r in (0, 1)), 30,
               "both ranks to register their save callback")  # fmt: skip
    assert d.proc.poll() is None, d.stderr()
