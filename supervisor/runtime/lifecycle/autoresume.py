"""Auto-resume: the finished-flag file (nvidia-resiliency-ext's FAULT_TOL_FINISHED_FLAG_FILE).

An outer loop (a SLURM requeue, a Kubernetes Job's retries) relaunches the run
until training is complete. The flag file is how it knows: a run that finds it
exits 0 without starting ranks, and ``--autoresume`` creates it when the job
completes (the Lightning callback's ``autoresume=True`` does the same from rank 0).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import orjson

from supervisor.clock import SYSTEM
from supervisor.runtime.records.reason import write_atomically

ENV = "FAULT_TOL_FINISHED_FLAG_FILE"


def export(flag: Path | None, run_dir: Path) -> None:
    """Ranks learn the file's name from their environment (as under ft_launcher).

    Without a configured file they get one in the run directory, so that a rank's
    "training finished" (the Lightning callback's ``autoresume=True``) always has a
    place to go instead of failing the job's setup; no outer loop reads that one.
    """
    os.environ[ENV] = str(flag if flag is not None else run_dir / "finished")


def mark_finished(flag: Path, run_id: str) -> None:
    content = {"run_id": run_id, "node": socket.gethostname(), "t_wall": SYSTEM.wall()}
    write_atomically(flag, orjson.dumps(content) + b"\n")
