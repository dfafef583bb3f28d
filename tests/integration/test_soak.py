"""The soak harness, short: a real 2-rank torch job under rank faults and chaos on
every input of the daemon, and no wrong decision, lost step or orphan."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "soak.py"


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.timeout(240)
def test_a_short_soak_makes_no_wrong_decision() -> None:
    # the daemon's ipc sockets live under --out, and sun_path holds 108 bytes: under xdist
    # tmp_path (.../popen-gw0/test_a_short_soak_makes_no_wro0/home/ft-supervisor/<pid>/
    # control.sock) is too long for them, and the daemon could not start
    with tempfile.TemporaryDirectory(prefix="fts-") as where:
        r = subprocess.run([sys.executable, str(SOAK), "--duration", "20", "--seed", "7", "--out", where],
                           capture_output=True, text=True, timeout=220, check=False)  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    rows = {
        cells[1].strip(): cells[2].strip()
        for line in out.splitlines()
        if line.startswith("| ") and len(cells := line.split("|")) == 4
    }
    for measure in ("false hang declarations", "healthy ranks killed", "lost steps", "orphans left"):
        assert rows[measure] == "0", out[-4000:]
    assert int(rows["faults injected"]) >= 2, out[-4000:]
    assert rows["faults recovered"] == rows["faults injected"], out[-4000:]
