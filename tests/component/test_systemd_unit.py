"""scripts/ft-supervisor.service passes ``systemd-analyze verify``: every directive known to
this systemd, every value parsed, the commands executable. Skipped, saying why, where
systemd-analyze is not installed (scripts/test.sh installs it on a Debian CI machine)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNIT = Path(__file__).parents[2] / "scripts" / "ft-supervisor.service"
ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed (Debian: systemd)")


def _verify(tmp: Path, text: str) -> tuple[int, str]:
    # ExecStart names where the unit expects the installed daemon; verify checks that it is
    # executable, so point it at an executable here (the rest of the unit is as shipped)
    daemon = tmp / "bin" / "ft-supervisor"
    daemon.parent.mkdir()
    daemon.write_text("#!/bin/sh\nexit 0\n")
    daemon.chmod(0o755)
    assert "/opt/ft-supervisor/bin/ft-supervisor" in text
    unit = tmp / UNIT.name
    unit.write_text(text.replace("/opt/ft-supervisor/bin/ft-supervisor", str(daemon)))
    assert ANALYZE is not None
    r = subprocess.run([ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60)
    return r.returncode, (r.stdout + r.stderr).strip()


def test_the_unit_verifies_without_a_warning(tmp_path: Path) -> None:
    assert _verify(tmp_path, UNIT.read_text()) == (0, "")


def test_verify_would_catch_a_misspelt_directive(tmp_path: Path) -> None:
    """The check above is not vacuous: systemd ignores an unknown key, with a warning."""
    text = re.sub(r"^RestartPreventExitStatus=", "RestartPreventExitStatuss=", UNIT.read_text(), flags=re.M)
    code, output = _verify(tmp_path, text)
    assert "Unknown key" in output and "RestartPreventExitStatuss" in output, (code, output)
