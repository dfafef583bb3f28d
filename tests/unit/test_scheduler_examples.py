"""The scheduler examples in scripts/schedulers map the exit codes the daemon really uses."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from supervisor.core.exitcodes import ExitCodes

EXAMPLES = Path(__file__).parents[2] / "scripts" / "schedulers"
CODES = ExitCodes()


def _load(name: str) -> Any:
    return yaml.safe_load((EXAMPLES / name).read_text())


def test_kubernetes_fails_the_job_on_abort_and_retries_a_reschedule() -> None:
    spec = _load("k8s-job.yaml")["spec"]
    rules = {r["action"]: r for r in spec["podFailurePolicy"]["rules"]}
    assert rules["FailJob"]["onExitCodes"]["values"] == [CODES.abort]
    assert rules["Count"]["onExitCodes"]["values"] == [CODES.reschedule]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it


def test_kubeflow_exit_code_policy_splits_permanent_from_retryable() -> None:
    replicas = _load("kubeflow-pytorchjob.yaml")["spec"]["pytorchReplicaSpecs"]
    assert {r["restartPolicy"] for r in replicas.values()} == {"ExitCode"}
    # the operator: 1-127 permanent, 128-255 retryable
    assert 1 <= CODES.abort <= 127 and 128 <= CODES.reschedule <= 255


def test_osmo_reschedules_on_the_reschedule_code() -> None:
    spec = _load("osmo-workflow.yaml")
    group = spec["workflow"]["groups"][0]
    # the reschedule tutorial's group semantics: a task's reschedule restarts the whole group
    assert group["ignoreNonleadStatus"] is False
    assert [t.get("lead", False) for t in group["tasks"]].count(True) == 1
    nodes = spec["default-values"]["nodes"]
    assert len(group["tasks"]) == nodes
    for task in group["tasks"]:
        assert task["exitActions"]["RESCHEDULE"] == CODES.reschedule
        script = task["args"][0]
        assert f"--reschedule-exit-code {CODES.reschedule}" in script
        assert "--rdzv-endpoint {{host:master}}:" in script and "--nnodes {{nodes}}" in script
        # no package-index name we do not own: the wheel in the image, or a source the user sets
        assert "pip install ft-supervisor" not in script
        assert 'pip install "{{ft_supervisor_source}}"' in script
    assert "PLACEHOLDER" in (EXAMPLES / "osmo-workflow.yaml").read_text()


def test_the_slurm_loop_stops_on_the_abort_code_and_excludes_on_the_reschedule_code() -> None:
    text = (EXAMPLES / "slurm-autoresume.sh").read_text()
    for name, code in (("ABORT_CODE", CODES.abort), ("RESCHEDULE_CODE", CODES.reschedule)):
        match = re.search(rf"{name}=\$\{{{name}:-(\d+)\}}", text)
        assert match is not None and int(match.group(1)) == code, name
