"""scripts/node-guard.sh, the Kubernetes init step that keeps a job off a quarantined node:
the real script and the real ``ft-supervisor node`` reading a real ledger; kubectl is a
stand-in that records what it was asked (no cluster here)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from supervisor.config.health import HealthConfig
from supervisor.core.exitcodes import ExitCodes
from supervisor.core.health import Ledger, Mark
from supervisor.runtime.records.health import write_ledger

ROOT = Path(__file__).parents[2]
GUARD = ROOT / "scripts" / "node-guard.sh"


def _guard(tmp: Path, *args: str, kubectl_fails: bool = False) -> tuple[int, str, list[str]]:
    calls = tmp / "kubectl.calls"
    kubectl = tmp / "kubectl"
    kubectl.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\nexit {1 if kubectl_fails else 0}\n')
    ft = tmp / "ft-supervisor"
    ft.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m supervisor "$@"\n')
    for script in (kubectl, ft):
        script.chmod(0o755)
    env = {**os.environ, "NODE_NAME": "gpu-node-7", "KUBECTL": str(kubectl), "FT_SUPERVISOR": str(ft),
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    r = subprocess.run(["sh", str(GUARD), *args], env=env, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stderr, calls.read_text().splitlines() if calls.exists() else []


def _one_mark_quarantines(tmp: Path) -> tuple[str, ...]:
    return ("--node-state-dir", str(tmp / "state"), "--node-quarantine", "1/24h")


def _mark(state: Path, count: int) -> None:
    now = time.time()
    marks = tuple(Mark(at=now - i, kind="hardware", rule="H1", detail="NVRM: Xid 79", run_id="r")
                  for i in range(count))  # fmt: skip
    write_ledger(HealthConfig(state_dir=state), Ledger(marks))


def test_a_quarantined_node_is_labelled_and_the_pod_fails_with_the_reschedule_code(tmp_path: Path) -> None:
    _mark(tmp_path / "state", 1)
    code, err, calls = _guard(tmp_path, *_one_mark_quarantines(tmp_path))
    assert code == ExitCodes().reschedule, err
    assert calls == ["label node gpu-node-7 ft-supervisor.io/quarantined=true --overwrite"]


def test_a_healthy_node_or_a_ledger_below_the_threshold_lets_the_trainer_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert _guard(tmp_path, "--node-state-dir", str(state), "--node-quarantine", "1/24h")[::2] == (0, [])
    _mark(state, 1)
    assert _guard(tmp_path, "--node-state-dir", str(state), "--node-quarantine", "2/24h")[::2] == (0, [])


def test_a_label_that_cannot_be_set_still_fails_the_pod(tmp_path: Path) -> None:
    """Without the label the next pod may land here again: failing this one is still right."""
    _mark(tmp_path / "state", 1)
    code, err, calls = _guard(tmp_path, *_one_mark_quarantines(tmp_path), kubectl_fails=True)
    assert code == ExitCodes().reschedule and len(calls) == 1
    assert "could not label gpu-node-7" in err


def test_a_guard_that_cannot_judge_the_ledger_lets_the_trainer_start(tmp_path: Path) -> None:
    code, err, calls = _guard(tmp_path, "--node-quarantine", "not-a-threshold")
    assert (code, calls) == (0, []) and "starting anyway" in err
