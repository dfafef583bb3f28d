"""Where a run keeps what outlives it.

<log-dir>/<run id>/<UTC stamp>-<host>-<pid>/      one daemon run
    events.jsonl                                  the event log
    gen_<g>/local_rank_<r>/stdout.log             what each rank printed
                           stderr.log
                           error.json             its torchelastic error file
"""

from __future__ import annotations

import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from supervisor.config.run import safe_name
from supervisor.process.spawn import RankFiles


@dataclass(frozen=True, slots=True)
class RunDir:
    root: Path

    @classmethod
    def create(cls, log_dir: Path, run_id: str, pid: int, wall: float) -> RunDir:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(wall))
        name = f"{stamp}-{socket.gethostname()}-{pid}"
        root = log_dir / safe_name(run_id) / name
        root.mkdir(parents=True, exist_ok=False)
        return cls(root)

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    def generation(self, number: int) -> Path:
        return self.root / f"gen_{number}"

    def rank_files(self, generation: int, local_rank: int) -> RankFiles:
        return RankFiles.under(self.generation(generation), local_rank)

    def forget_generation(self, number: int) -> None:
        """Remove the files of a generation that never started (unused standbys)."""
        shutil.rmtree(self.generation(number), ignore_errors=True)
