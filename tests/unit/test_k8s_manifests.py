"""The Kubernetes recipes in scripts/schedulers are valid API objects and say what the
guide says they do.

Validation is offline: the core resources (batch/v1 Job, the pod templates inside a JobSet
or a Kubeflow PyTorchJob, RBAC) against the Kubernetes API's JSON schemas that
``kubernetes-validate`` bundles, strictly (an unknown field is an error, as the API server
would prune it silently); the JobSet against its custom resource's OpenAPI schema, vendored
in tests/fixtures/k8s (README there: source and version), with unknown fields rejected too.
What neither schema can say (the exit-code mapping, GPUs for ``--nproc-per-node gpu``, a
memory-backed /dev/shm, the guard and the node affinity agreeing on the label) is asserted
below.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # kubernetes-validate brings it
import kubernetes_validate  # the test extra
import pytest
import yaml

from supervisor.core.exitcodes import ExitCodes

ROOT = Path(__file__).parents[2]
RECIPES = ROOT / "scripts" / "schedulers"
JOBSET_SCHEMA = ROOT / "tests" / "fixtures" / "k8s" / "jobset-v1alpha2.schema.json"
CODES = ExitCodes()
# podFailurePolicy is GA from 1.31; the newest the validator bundles, too
VERSIONS = ("1.31.0", kubernetes_validate.latest_version())
GUARD = (ROOT / "scripts" / "node-guard.sh").read_text()
LABEL = re.search(r"QUARANTINE_LABEL=\$\{QUARANTINE_LABEL:-([^}]+)\}", GUARD).group(1)  # type: ignore[union-attr]


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((RECIPES / name).read_text()) if d]


def _validate_core(doc: dict[str, Any]) -> None:
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata'].get('name')} against Kubernetes {version}: {exc}")


def _as_job(name: str, job_spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": job_spec}


def _as_pod_template(name: str, template: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}


def _unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> Iterator[str]:
    """Fields the CRD's structural schema does not know: the API server drops them."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                yield from _unknown_fields(item, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                yield from _unknown_fields(item, extra, f"{path}.{key}")
            elif props is not None:
                yield f"{path}.{key}"
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _unknown_fields(item, schema["items"], f"{path}[{i}]")


def _pod_specs() -> Iterator[tuple[str, dict[str, Any], dict[str, Any] | None]]:
    """(recipe, pod spec, its Job's podFailurePolicy if any) for every pod template."""
    job = _docs("k8s-job.yaml")[0]["spec"]
    yield "k8s-job.yaml", job["template"]["spec"], job["podFailurePolicy"]
    for rjob in _docs("k8s-jobset.yaml")[0]["spec"]["replicatedJobs"]:
        spec = rjob["template"]["spec"]
        yield f"k8s-jobset.yaml {rjob['name']}", spec["template"]["spec"], spec["podFailurePolicy"]
    for role, replica in _docs("kubeflow-pytorchjob.yaml")[0]["spec"]["pytorchReplicaSpecs"].items():
        yield f"kubeflow-pytorchjob.yaml {role}", replica["template"]["spec"], None


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_the_job_and_the_guards_rbac_are_valid_kubernetes_objects() -> None:
    for name in ("k8s-job.yaml", "k8s-node-guard-rbac.yaml"):
        for doc in _docs(name):
            _validate_core(doc)


def test_the_jobset_is_valid_against_the_jobset_crd_and_its_jobs_against_kubernetes() -> None:
    (jobset,) = _docs("k8s-jobset.yaml")
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    schema = json.loads(JOBSET_SCHEMA.read_text())
    jsonschema.validate(jobset, schema)
    assert list(_unknown_fields(jobset, schema)) == []
    for rjob in jobset["spec"]["replicatedJobs"]:
        _validate_core(_as_job(rjob["name"], rjob["template"]["spec"]))


def test_the_validation_catches_a_misspelt_field() -> None:
    """The checks above would pass anything if they looked at nothing."""
    (jobset,) = _docs("k8s-jobset.yaml")
    schema = json.loads(JOBSET_SCHEMA.read_text())
    jobset["spec"]["failurePolicy"]["maxRestart"] = 2
    assert list(_unknown_fields(jobset, schema)) == [".spec.failurePolicy.maxRestart"]
    jobset["spec"]["failurePolicy"]["rules"][0]["action"] = "Reschedule"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(jobset, schema)
    job = _docs("k8s-job.yaml")[0]
    job["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, VERSIONS[0], strict=True)


def test_the_kubeflow_pod_templates_are_valid_kubernetes_pod_templates() -> None:
    (job,) = _docs("kubeflow-pytorchjob.yaml")
    for role, replica in job["spec"]["pytorchReplicaSpecs"].items():
        _validate_core(_as_pod_template(role.lower(), replica["template"]))
        assert replica["restartPolicy"] == "ExitCode"
    # the operator: 1-127 permanent, 128-255 retryable
    assert 1 <= CODES.abort <= 127 and 128 <= CODES.reschedule <= 255


def test_the_pod_failure_policies_map_the_exit_codes() -> None:
    for recipe, pod, policy in _pod_specs():
        if policy is None:
            continue
        assert pod["restartPolicy"] == "Never", recipe  # podFailurePolicy requires it
        by_code = {code: rule for rule in policy["rules"] if "onExitCodes" in rule
                   for code in rule["onExitCodes"]["values"]}  # fmt: skip
        abort, reschedule = by_code[CODES.abort], by_code[CODES.reschedule]
        assert abort["action"] == "FailJob" and abort["onExitCodes"]["containerName"] == "trainer", recipe
        # no containerName: the guard's 200 counts as the trainer's does
        assert reschedule["action"] == "Count" and "containerName" not in reschedule["onExitCodes"], recipe
        disrupted = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
        assert disrupted in policy["rules"], recipe


def test_an_abort_fails_the_jobset_and_a_node_out_of_retries_restarts_it() -> None:
    spec = _docs("k8s-jobset.yaml")[0]["spec"]
    rules = {r["name"]: r for r in spec["failurePolicy"]["rules"]}
    # a Job failed by its podFailurePolicy's FailJob (the abort code) has this reason
    abort = rules["abort"]
    assert (abort["action"], abort["onJobFailureReasons"]) == ("FailJobSet", ["PodFailurePolicy"])
    assert rules["node-out-of-retries"]["action"] == "RestartJobSet"
    (rjob,) = spec["replicatedJobs"]
    assert spec["coordinator"]["replicatedJob"] == rjob["name"]
    (trainer,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in trainer["env"]}
    assert int(env["PET_NNODES"]["value"]) == rjob["replicas"] * rjob["template"]["spec"]["parallelism"]
    assert env["PET_RDZV_ENDPOINT"]["value"].startswith("$(COORDINATOR):")
    assert "coordinator" in env["COORDINATOR"]["valueFrom"]["fieldRef"]["fieldPath"]


def test_every_pod_asks_for_its_gpus_and_a_memory_backed_dev_shm() -> None:
    for recipe, pod, _ in _pod_specs():
        (trainer,) = pod["containers"]
        args = trainer["args"]
        if _option(args, "--nproc-per-node") == "gpu":
            assert int(trainer["resources"]["limits"]["nvidia.com/gpu"]) >= 1, recipe
        volumes = {v["name"]: v for v in pod["volumes"]}
        (shm,) = [m for m in trainer["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        assert volumes[shm["name"]]["emptyDir"]["medium"] == "Memory", recipe
        # the termination message: a bounded copy of reason.json
        assert _option(args, "--reason-file") == "/dev/termination-log", recipe
        # room for the dying-gasp save: --save-timeout + the default shutdown (30) and kill (10)
        save = float(_option(args, "--save-timeout") or 60)
        assert pod["terminationGracePeriodSeconds"] > save + 30 + 10, recipe


def test_the_guard_and_the_trainer_share_the_ledger_and_the_affinity_avoids_the_guards_label() -> None:
    for recipe, pod, _ in _pod_specs():
        (guard,) = pod["initContainers"]
        (trainer,) = pod["containers"]
        assert guard["command"][0].endswith("/scripts/node-guard.sh"), recipe
        for option in ("--node-state-dir", "--node-quarantine"):
            assert _option(guard["command"], option) == _option(trainer["args"], option), (recipe, option)
        state_dir = _option(trainer["args"], "--node-state-dir")
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in (guard, trainer):
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == state_dir]
            assert volumes[mount["name"]]["hostPath"]["path"], recipe  # outlives the pod, on the node
        node_name = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
        assert node_name in guard["env"], recipe
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        (term,) = terms["nodeSelectorTerms"]
        assert {"key": LABEL, "operator": "DoesNotExist"} in term["matchExpressions"], recipe
        assert pod["serviceAccountName"] == "ft-supervisor-node-guard", recipe
    rbac = {d["kind"]: d for d in _docs("k8s-node-guard-rbac.yaml")}
    assert rbac["ServiceAccount"]["metadata"]["name"] == "ft-supervisor-node-guard"
    assert {"patch", "get"} <= set(rbac["ClusterRole"]["rules"][0]["verbs"])
    assert 'exit "$RESCHEDULE_CODE"' in GUARD and f"RESCHEDULE_CODE:-{CODES.reschedule}" in GUARD


def test_the_recipes_cite_only_files_in_the_repository() -> None:
    cited: set[str] = set()
    # the SLURM recipes (slurm-*.sh, etcd-rendezvous.sh) are another test's
    ours = [p for p in RECIPES.iterdir() if p.name.startswith(("k8s", "kubeflow", "osmo"))]
    for path in [*ours, ROOT / "scripts" / "node-guard.sh", ROOT / "scripts" / "entrypoint.sh",
                 ROOT / "scripts" / "ft-supervisor.service"]:  # fmt: skip
        text = path.read_text()
        assert "DESIGN.md" not in text, path.name
        cited |= set(re.findall(r"(?<![\w/.-])((?:docs|scripts|tests|supervisor)/[\w./-]+\.\w+)", text))
        cited |= {f"scripts/schedulers/{n}" for n in re.findall(r"\b([\w-]+\.(?:yaml|sh))\b", text)
                  if (RECIPES / n).exists() or n.startswith(("k8s", "kubeflow", "osmo"))}  # fmt: skip
    missing = sorted(c for c in cited if not (ROOT / c).exists())
    assert missing == [], missing
