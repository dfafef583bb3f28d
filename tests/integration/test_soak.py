"""The soak harness, short: a real 2-rank torch job under rank faults and chaos on
every input of the daemon, and no wrong decision, lost step or orphan."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "soak.py"


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.timeout(240)
def test_a_short_soak_makes_no_wrong_decision(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SOAK), "--duration", "20", "--seed", "7", "--out", str(tmp_path)],
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
