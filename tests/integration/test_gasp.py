"""The dying gasp through the real sockets: a rank's save callback, registered by its
client on a socket of its own, gets the daemon's "save now" and answers before the
rank is stopped. What is asked, of whom, and how long a save may hold the stop is in
tests/fast/test_gasp.py; this is the one real-process path (the client's saver
thread and the daemon's ROUTER send to its identity)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.support import RANKS, Daemon

SAVER = str(RANKS / "saver.py")
FAST = ("--nproc-per-node", "2", "--preload", "none")
Start = Callable[..., Daemon]


def test_a_crash_asks_the_survivor_to_save_before_the_restart(start: Start, tmp_path: Path) -> None:
    d = start(*FAST, "--max-restarts", "1", SAVER, "--dir", str(tmp_path), "--crash-rank", "1")
    assert d.wait() == 0, d.story()
    (finished,) = d.events("save_finished")
    assert finished["saved"] == [0] and finished["failed"] is None and finished["unanswered"] is None
    saved = json.loads((tmp_path / "saved.0.0.json").read_text())
    assert saved["reason"] == "generation 0 failed" and saved["deadline"] == 60.0
