"""A rank for scripts/bench/gasp.py: no torch. Registers a save callback (unless
--no-callback) that writes --bytes bytes and fsyncs them, steps with heartbeats, and
in generation 0 rank 1 exits 1 once every rank is ready. Generation 1 exits 0."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from supervisor import client

where, size, callback = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "callback"
rank, gen, world = (int(os.environ[k]) for k in ("RANK", "TORCHELASTIC_RESTART_COUNT", "WORLD_SIZE"))


def save(request: client.SaveRequest) -> None:
    with (where / f"gasp.{rank}.{gen}").open("wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())


client.init()
if callback:
    client.on_save(save)
(where / f"ready.{rank}.{gen}").touch()
while not all((where / f"ready.{r}.{gen}").exists() for r in range(world)):
    time.sleep(0.005)
if gen == 0 and rank == 1:
    sys.exit(1)
while gen == 0:
    client.heartbeat()
    time.sleep(0.01)
