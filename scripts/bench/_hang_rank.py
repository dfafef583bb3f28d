"""A training rank for scripts/bench/hang.py: DDP over gloo on CPU, like scripts/train.py,
that heartbeats every step and hangs once.

    _hang_rank.py --steps N --hang-at-step S --hang-rank R --events FILE

Every generation trains --steps steps of --step-time seconds (a tiny DDP model,
then a sleep) and calls ``client.heartbeat()`` after each. In generation 0 only,
rank R hangs (sleeps until it is killed) when it reaches step S; its peers then
block in DDP's all-reduce, so they stop heartbeating too. Milestones go to
--events, one JSON line each, wall clock (time.time()): ``first_step`` of each
generation, ``hang`` (with ``last_heartbeat``: when the hanging rank's last
heartbeat left), ``done``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from supervisor import client


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="steps per generation")
    p.add_argument("--step-time", type=float, default=0.05, help="seconds per step (sleep)")
    p.add_argument("--hang-at-step", type=int, default=160)
    p.add_argument("--hang-rank", type=int, default=1)
    p.add_argument("--events", type=Path, required=True, help="append milestones as JSON lines")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def milestone(what: str, **fields: object) -> None:
        line = json.dumps({"event": what, "t": time.time(), "rank": rank, "generation": generation, **fields})
        with args.events.open("a") as f:
            f.write(line + "\n")

    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        last_heartbeat: float | None = None
        for step in range(args.steps):
            if generation == 0 and rank == args.hang_rank and step == args.hang_at_step:
                milestone("hang", step=step, last_heartbeat=last_heartbeat)
                while True:  # hung: the daemon must notice and kill us
                    time.sleep(3600)
            g = torch.Generator().manual_seed(step * 1000 + rank)
            x = torch.randn(64, 16, generator=g)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True) * 0.1)
            loss.backward()
            optimizer.step()
            time.sleep(args.step_time)
            client.heartbeat()
            last_heartbeat = time.time()
            if step == 0:
                milestone("first_step", step=step)
        milestone("done", steps=args.steps)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
