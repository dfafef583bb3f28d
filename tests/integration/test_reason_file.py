"""``--reason-file`` through a real run: a rank whose error line and error file are
100 KB each, the reason file (Kubernetes' /dev/termination-log) whole JSON under 4096
bytes, and the run directory's reason.json the whole record."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from supervisor.runtime.records.reason import REASON_FILE_LIMIT
from tests.support import RANKS, Daemon

Start = Callable[..., Daemon]


def test_a_100_kb_failure_leaves_a_termination_message_under_4_kib(start: Start, tmp_path: Path) -> None:
    huge_line = tmp_path / "huge.log"
    huge_line.write_text("NCCL WARN " + "x" * 100_000 + "\n")
    termination_log = tmp_path / "termination-log"
    d = start("--nproc-per-node", "2", "--max-restarts", "0", "--preload", "none",
              "--reason-file", str(termination_log), str(RANKS / "fails.py"), "--rank", "1",
              "--say-file", str(huge_line), "--error-file",
              "--raise", "ValueError", "y" * 100_000)  # fmt: skip
    assert d.wait(60) == 2, d.story()

    data = termination_log.read_bytes()
    assert len(data) <= REASON_FILE_LIMIT, len(data)
    cut = json.loads(data)
    assert (cut["outcome"], cut["exit_code"], cut["rank"]) == ("abort", 2, 1)
    assert cut["decision"]["action"] == "abort"
    assert cut["truncated"] is True

    run_dir = d.run_dir()
    assert run_dir is not None
    full = run_dir / "reason.json"
    assert cut["full"] == str(full)
    whole = json.loads(full.read_text())  # the whole record, 100 KB texts and all
    assert len(full.read_bytes()) > 100_000 and whole["outcome"] == "abort"
    assert [e["path"] for e in d.events("reason_written")] == [str(full), str(termination_log)]
