"""The package as a user installs it (tox's py311 environment installs the built wheel):
only our import names and a license, and a job run by the installed console script from a
project that has its own ``plugins`` package, with no checkout on the path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# rank 1 of the first generation crashes; then every rank ends well
CRASH_ONCE = """\
import os, sys
argv = open("/proc/self/cmdline", "rb").read().decode().split("\\0")
print("bootstrap", next(a for a in argv if a.endswith("bootstrap.py")), flush=True)
if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(3)
"""
JOB = ("--nproc-per-node", "2", "--preload", "none", "--max-restarts", "1", "--rdzv-id", "t")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    return {**env, **extra}


def _events(log_dir: Path, name: str) -> list[dict[str, Any]]:
    lines = next(log_dir.glob("t/*/events.jsonl")).read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


# what the installed package is, seen as the console script sees it: from a directory
# that is not the checkout, in isolated mode (no PYTHONPATH, no current directory)
INSTALLED = """\
import importlib.metadata, json, sys, sysconfig
import supervisor, ft_supervisor_plugins
dist = importlib.metadata.distribution("ft-supervisor")
direct = json.loads(dist.read_text("direct_url.json") or "{}")
print(json.dumps({
    "editable": bool(direct.get("dir_info", {}).get("editable")),
    "site": sysconfig.get_paths()["purelib"],
    "modules": [supervisor.__file__, ft_supervisor_plugins.__file__],
    "top": sorted({str(f).split("/")[0] for f in dist.files or () if not str(f).startswith("..")}),
    "license": dist.read_text("licenses/LICENSE") or "",
    "license_expression": dist.metadata["License-Expression"],
}))
"""


@pytest.mark.slow
def test_the_installed_wheel_runs_a_job_beside_a_projects_own_plugins_package(tmp_path: Path) -> None:
    # issue 22: CI installs the wheel and runs a 2-rank job with a crash through it. The wheel
    # installed a top-level `plugins`: a project's own `plugins/`, first on the path, hid it
    # and `run` died with "No module named 'plugins.rules'" (the editable install of a
    # checkout maps the name in its own finder, which hid the bug: hence the wheel)
    project = tmp_path / "project"
    (project / "plugins").mkdir(parents=True)
    (project / "plugins" / "__init__.py").write_text('"""the project\'s own plugins"""\n')
    seen = subprocess.run([sys.executable, "-I", "-c", INSTALLED], cwd=project, env=_env(),
                          capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    installed = json.loads(seen.stdout)
    if installed["editable"]:
        pytest.skip("installed editable from the checkout: tox -e py311 runs this on the built wheel")
    site = Path(installed["site"]).resolve()
    assert all(Path(f).resolve().is_relative_to(site) for f in installed["modules"]), installed["modules"]
    ours = [n for n in installed["top"] if not n.endswith(".dist-info")]
    assert ours == ["ft_supervisor_plugins", "supervisor"]  # no `plugins`, no stray file
    assert "Apache License" in installed["license"] and installed["license_expression"] == "Apache-2.0"

    # the console script, from the project: its `plugins` first on the path (the current
    # directory and PYTHONPATH), the checkout nowhere on it
    (project / "train.py").write_text(CRASH_ONCE)
    script = Path(sys.executable).with_name("ft-supervisor")
    r = subprocess.run([str(script), "run", "--log-dir", str(tmp_path / "logs"), *JOB, "train.py"],
                       cwd=project, env=_env(PYTHONPATH=str(project)), capture_output=True, text=True,
                       timeout=60, check=False)  # fmt: skip
    assert r.returncode == 0 and "No module named" not in r.stderr, r.stderr[-3000:]
    loaded = _events(tmp_path / "logs", "plugins_loaded")[0]
    assert loaded["plugins"] == ["rules"] and not loaded.get("failed"), loaded
    decisions = [(e["action"], e.get("classifier")) for e in _events(tmp_path / "logs", "decision")]
    assert decisions == [("restart", "rules")], decisions  # the built-in rules judged the crash
    bootstraps = {line.split()[-1] for line in r.stdout.splitlines() if " bootstrap " in line}
    assert bootstraps and all(Path(b).resolve().is_relative_to(site) for b in bootstraps), r.stdout
