"""NeMo-Run's ft_launcher command line, verbatim, with ``ft-supervisor run`` in place
of ``ft_launcher``: a real job runs to its end.

The argv is built the way NeMo-Run's torchx component builds it
(nemo_run/run/torchx_backend/components/ft_launcher.py and torchrun.py, read, not
imported): the FT settings as ``--ft-<name_with_underscores> VALUE`` and
``--max-restarts N`` (with DGX Cloud, ``--ft-use-infra-group-rank False``), or
``--ignore-missing-fault-tol-cfg`` when none is given; then torchrun's options
and ``--tee 3``, the script and its arguments.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """\
import os, sys
rank, restarts = os.environ["RANK"], int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"hello from rank {rank} of {os.environ['WORLD_SIZE']}, args {sys.argv[1:]}", flush=True)
if rank == "1" and restarts == 0 and "--crash-once" in sys.argv:
    sys.exit(1)
"""


def nemo_run_argv(
    script: str, *script_args: str, nproc: int, rdzv_id: int, underscores: bool = False,
    workload_check_interval: float | None = None, initial_rank_heartbeat_timeout: float | None = None,
    rank_heartbeat_timeout: float | None = None, rank_termination_signal: str | None = None,
    log_level: str | None = None, max_restarts: int | None = None, dgxc: bool = False,
) -> list[str]:  # fmt: skip
    """What NeMo-Run puts after ``ft_launcher`` for a single node (j="1xN")."""
    given = {
        "workload_check_interval": workload_check_interval,
        "initial_rank_heartbeat_timeout": initial_rank_heartbeat_timeout,
        "rank_heartbeat_timeout": rank_heartbeat_timeout,
        "rank_termination_signal": rank_termination_signal,
        "log_level": log_level,
    }
    if any(v is not None for v in (*given.values(), max_restarts)):
        ft = [arg for name, value in given.items() if value for arg in (f"--ft-{name}", str(value))]
        if max_restarts:
            ft += ["--max-restarts", str(max_restarts)]
        if dgxc:
            ft += ["--ft-use-infra-group-rank", "False"]
    else:
        ft = ["--ignore-missing-fault-tol-cfg"]
    # torchrun's part; a single node rendezvouses on port 0 of localhost. torchx's own
    # components write the underscore spellings, NeMo-Run's the dashed ones
    dash = "_" if underscores else "-"
    torchrun = [f"--rdzv{dash}backend", "c10d", f"--rdzv{dash}endpoint", "localhost:0", f"--rdzv{dash}id",
                str(rdzv_id), "--nnodes", "1", f"--nproc{dash}per{dash}node", str(nproc), f"--node{dash}rank",
                "0", "--tee", "3"]  # fmt: skip
    return [shlex.quote(a) for a in (*ft, *torchrun, script, *script_args)]


def _run(tmp: Path, argv: list[str]) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]]]:
    # the command line stays verbatim; the preload (a PET_ default, as torchrun reads them) only
    # keeps this test fast
    env = {**os.environ, "PET_PRELOAD": "none"}
    r = subprocess.run([sys.executable, "-m", "supervisor", "run", *argv], cwd=tmp, env=env,
                       capture_output=True, text=True, timeout=90, check=False)  # fmt: skip
    found = sorted(tmp.glob("ft-supervisor-logs/*/*/events.jsonl"))
    assert found, r.stderr
    return r, [json.loads(line) for line in found[-1].read_text().splitlines()]


def test_without_ft_settings_ignore_missing_fault_tol_cfg(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    argv = nemo_run_argv("train.py", "--lr", "1", nproc=2, rdzv_id=4321, underscores=True)
    assert argv[0] == "--ignore-missing-fault-tol-cfg" and "--nproc_per_node" in argv
    r, events = _run(tmp_path, argv)
    assert r.returncode == 0, r.stderr
    assert "hello from rank 1 of 2, args ['--lr', '1']" in r.stdout + r.stderr  # --tee 3: on the console
    assert not [e for e in events if e["event"] == "settings_ignored"]  # nothing asked went unheeded
    logs = [p.read_text() for p in tmp_path.glob("ft-supervisor-logs/**/*") if p.is_file()]
    assert any("hello from rank 0 of 2" in text for text in logs)  # and in the log files

