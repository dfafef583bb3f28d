"""A gloo rank for scripts/bench/blame.py: every rank all-reduces every step across the job's
nodes; in generation 0, global rank --culprit misbehaves at step --at while the others wait:

--fault own_code      it sleeps in a function of its own inside its step
--fault before_coll   it blocks reading a pipe nobody writes, right before the all_reduce
                      (absent from a collective every other rank entered)
--fault sigstop       it stops itself (SIGSTOP): its process is still there, frozen
--fault desync_op     it calls all_gather where the others call all_reduce
--fault desync_size   it all-reduces 16 floats where the others all-reduce 8
--fault slow          it computes for --slow s (past the section timeout), then goes on

Torch-free apart from torch.distributed itself; no DDP (the collectives are the point).
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

from supervisor import client


def stuck_in_own_code() -> None:
    time.sleep(3600)


def blocked_before_the_collective() -> None:
    r, _w = os.pipe()  # the write end stays open and unwritten: read blocks for good
    os.read(r, 1)


def slow_step(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--fault",
        choices=("own_code", "before_coll", "sigstop", "desync_op", "desync_size", "slow"),
        required=True,
    )
    p.add_argument("--culprit", type=int, required=True)
    p.add_argument("--at", type=int, default=6)  # after the 5 warm-up iterations
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--slow", type=float, default=6.0)
    a = p.parse_args()
    rank, gen = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    client.init()
    world = dist.get_world_size()
    t = torch.ones(8)
    for step in range(a.steps):
        with client.section("step"):
            if gen == 0 and rank == a.culprit and step == a.at:
                if a.fault == "own_code":
                    stuck_in_own_code()
                elif a.fault == "before_coll":
                    blocked_before_the_collective()
                elif a.fault == "sigstop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                elif a.fault == "slow":
                    slow_step(a.slow)
                if a.fault == "desync_op":
                    dist.all_gather([torch.empty(8) for _ in range(world)], t)
                elif a.fault == "desync_size":
                    dist.all_reduce(torch.ones(16))
                else:
                    dist.all_reduce(t)
            else:
                dist.all_reduce(t)
        client.heartbeat()
        client.report_iteration(step)
    dist.destroy_process_group()
    print(f"rank {rank} generation {gen} done", flush=True)


if __name__ == "__main__":
    main()
