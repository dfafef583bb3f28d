"""A training rank for scripts/bench/decisions.py: DDP over gloo on CPU that fails on cue.

    _decision_rank.py --steps N --checkpoint FILE --events FILE [--fault KIND:RANK:GEN:STEP ...]

Every generation resumes from --checkpoint when it exists (``client.report_checkpoint
("loaded")``) and trains up to --steps: each step (a tiny DDP model, then a
--step-time sleep) inside ``with client.section("step")``, then ``client.heartbeat()``
and ``client.report_iteration(step + 1)``; rank 0 saves model, optimizer and step
every --save-every steps (``torch.save`` to a temporary file, ``os.replace``, then
``client.report_checkpoint("saved")``). So progress is real across generations.

A fault fires on rank RANK of generation GEN (``TORCHELASTIC_RESTART_COUNT``) at
step STEP; KIND is one of:

* ``hang-section``: sleep --late seconds (so that the peer's ``step`` section is the
  older one), open the step section, run the forward, then sleep forever before
  the backward; the peer blocks in DDP's gradient all-reduce with its own
  ``step`` open;
* ``hang-out``: after step STEP's section closed (and its heartbeat, iteration
  report and save), sleep forever "in data loading", out of any section; the peer
  opens its next step and blocks in the all-reduce;
* ``raise``: raise a RuntimeError inside the step section, before the backward;
* ``raise-slow``: the same, and then take --linger seconds to exit (an ``atexit``
  sleep, after the error file is written and the client has reported the
  exception; the process group is left open, so the peer keeps waiting in the
  all-reduce until the process is gone): a peer that already failed;
* ``kill``: SIGKILL itself inside the step section, before the backward.

Milestones go to --events, one JSON line each, wall clock (``time.time()``):
``started`` (with the step resumed from), ``first_step``, ``saved``, ``fault``
(kind, step: written the moment the fault begins), ``done``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from supervisor import client

KINDS = ("hang-section", "hang-out", "raise", "raise-slow", "kill")


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    rank: int
    generation: int
    step: int


def parse_fault(spec: str) -> Fault:
    parts = spec.split(":")
    if len(parts) != 4 or parts[0] not in KINDS:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected KIND:RANK:GEN:STEP, KIND one of {KINDS}")
    try:
        return Fault(parts[0], int(parts[1]), int(parts[2]), int(parts[3]))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{spec!r}: RANK, GEN and STEP must be integers") from exc


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60, help="the step training ends at")
    p.add_argument("--step-time", type=float, default=0.05, help="seconds of sleep per step")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--checkpoint", type=Path, required=True, help="checkpoint file to save and resume")
    p.add_argument("--late", type=float, default=0.2, help="hang-section: open the step this late")
    p.add_argument("--linger", type=float, default=6.0, help="raise-slow: seconds to take to exit")
    p.add_argument("--fault", type=parse_fault, action="append", default=[], help="KIND:RANK:GEN:STEP")
    p.add_argument("--events", type=Path, required=True, help="append milestones as JSON lines")
    return p.parse_args()


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = dist.get_rank()
        self.generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.faults = {
            f.step: f for f in args.fault if f.rank == self.rank and f.generation == self.generation
        }
        torch.manual_seed(0)
        self.model = DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.start = 0
        self.lingering = False  # raise-slow: leave the process group open until the process exits
        if args.checkpoint.exists():
            state = torch.load(args.checkpoint, map_location="cpu")
            self.model.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.start = state["step"]
            client.report_checkpoint("loaded")

    def milestone(self, what: str, **fields: object) -> None:
        line = {"event": what, "t": time.time(), "rank": self.rank, "generation": self.generation, **fields}
        with self.args.events.open("a") as f:
            f.write(json.dumps(line) + "\n")

    def save(self, step: int) -> None:
        state = {
            "model": self.model.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": step,
        }
        path = self.args.checkpoint
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)  # a kill mid-save never leaves a torn checkpoint
        client.report_checkpoint("saved")
        self.milestone("saved", step=step)

    def hang_forever(self, kind: str, step: int) -> None:
        self.milestone("fault", kind=kind, step=step)
        while True:  # the daemon must notice, and kill us
            time.sleep(3600)

    def inject_in_step(self, fault: Fault, step: int) -> None:
        """A fault inside the step section, after the forward, before the backward."""
        if fault.kind == "hang-section":
            self.hang_forever(fault.kind, step)
        self.milestone("fault", kind=fault.kind, step=step)
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "raise-slow":
            self.lingering = True
            atexit.register(time.sleep, self.args.linger)  # runs after the error is reported
        if fault.kind in ("raise", "raise-slow"):
            raise RuntimeError(f"injected fault at step {step} on rank {self.rank}")

    def train(self) -> None:
        self.milestone("started", step=self.start)
        for step in range(self.start, self.args.steps):
            fault = self.faults.get(step)
            if fault is not None and fault.kind == "hang-section":
                time.sleep(self.args.late)  # the peer's step section is the older one
            g = torch.Generator().manual_seed(step * 1000 + self.rank)  # "data loading"
            x = torch.randn(64, 16, generator=g)
            with client.section("step"):
                self.optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(self.model(x), x.sum(dim=1, keepdim=True) * 0.1)
                if fault is not None and fault.kind != "hang-out":
                    self.inject_in_step(fault, step)
                loss.backward()  # DDP's gradient all-reduce
                self.optimizer.step()
                time.sleep(self.args.step_time)
            client.heartbeat()
            client.report_iteration(step + 1)
            if step == self.start:
                self.milestone("first_step", step=step)
            if self.rank == 0 and (step + 1) % self.args.save_every == 0:
                self.save(step + 1)
            if fault is not None and fault.kind == "hang-out":
                self.hang_forever(fault.kind, step)
        self.milestone("done", step=self.args.steps)


@record
def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    trainer = Trainer(args)
    try:
        trainer.train()
    finally:
        if not trainer.lingering:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
