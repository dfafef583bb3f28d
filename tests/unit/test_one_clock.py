"""The daemon reads time and sleeps through its clock only (supervisor.clock): a test can
then run it on virtual time, and no deadline is measured on a clock its peers do not share."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "supervisor"
# inside the ranks (the client) and before the daemon's modules are imported (the bootstrap)
EXEMPT = ("client/", "process/bootstrap", "clock.py")
DIRECT = re.compile(
    r"\btime\.(monotonic|time|sleep|perf_counter|monotonic_ns|time_ns)\b|\basyncio\.sleep\(|\.call_later\(|\.call_at\("
)


def test_no_module_of_the_daemon_reads_time_or_sleeps_around_the_clock() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(EXEMPT):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if DIRECT.search(line) and "self._clock.call_later" not in line:
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
