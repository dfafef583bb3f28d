"""The goodput benchmark's training job (scripts/bench/goodput.py): DDP over gloo on
CPU, a snapshot every --save-every steps and resume from it, and a fixed schedule of
faults, each fired once whatever the launcher calls its generations.

--faults "5:raise,100:hang,200:nccl,300:sigkill"   fault i fires at step S_i on rank
    --fault-rank, once fault i-1 has fired: raise (a Python exception), hang (sleeps
    forever in the training loop; heartbeats stop, its peer waits in the all-reduce),
    nccl (an exception whose message is NCCL's watchdog timeout), sigkill. A marker
    file per fault in --fault-dir (created with O_EXCL) makes each fire exactly once.
--client ft|nvrx|none   heartbeats every step: ft-supervisor's client (with iteration
    and checkpoint reports), NVIDIA's RankMonitorClient (under ft_launcher), or none
    (torchrun, which has no hang detection but the collective timeout).
--pg-timeout S          the process group's collective timeout, the same under every
    launcher: torchrun's only way out of a hang.
--memory-snapshots      (with --client ft) ``client.snapshot`` of the training state
    after every step, and ``client.resume(disk_step)`` at start: the newer of the memory
    snapshot and the disk one (--save-every apart) is where the generation resumes.
--events FILE           one JSON line per milestone, wall clock: resumed (per rank and
    generation: the step it resumes from, and from where), first_step, fault, done.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

NCCL_TIMEOUT = (
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4021, OpType=ALLREDUCE, "
    "NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for 600046 milliseconds before timing out."
)
KINDS = ("raise", "hang", "nccl", "sigkill")


def parse_faults(spec: str) -> list[tuple[int, str]]:
    out = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        step, _, kind = part.partition(":")
        if kind not in KINDS:
            raise SystemExit(f"--faults {spec!r}: {kind!r} is not one of {', '.join(KINDS)}")
        out.append((int(step), kind))
    return out


class Client:
    """Heartbeats (and progress) to whichever monitor the launcher runs."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._nvrx: Any = None
        if kind == "nvrx":
            from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient  # noqa: PLC0415

            self._nvrx = RankMonitorClient()
            self._nvrx.init_workload_monitoring()
        elif kind == "ft":
            from supervisor import client  # noqa: PLC0415

            self._ft = client

    def step(self, steps_run: int) -> None:
        if self._nvrx is not None:
            self._nvrx.send_heartbeat()
        elif self.kind == "ft":
            self._ft.report_iteration(steps_run)
            self._ft.heartbeat()

    def saved(self) -> None:
        if self.kind == "ft":
            self._ft.report_checkpoint("saved")

    def snapshot(self, state: dict[str, Any], step: int) -> bool:
        return bool(self._ft.snapshot(state, step))

    def resume(self, disk_step: int | None) -> tuple[str, int | None, dict[str, Any] | None]:
        """Where to resume: (source, step, the memory snapshot's state when chosen)."""
        r = self._ft.resume(disk_step, disk_loaded=disk_step is not None)
        return r.choice.source, r.choice.step, r.state

    def close(self) -> None:
        if self._nvrx is not None:
            self._nvrx.shutdown_workload_monitoring()


class Job:
    def __init__(self, a: argparse.Namespace, client: Client) -> None:
        self.a = a
        self.rank = dist.get_rank()
        self.generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.faults = parse_faults(a.faults)
        torch.manual_seed(0)
        self.model = DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.steps_run = 0
        source = "none"
        if a.snapshot.exists():
            self._load(torch.load(a.snapshot, map_location="cpu"))
            source = "disk"
        if a.memory_snapshots:
            chosen, _, state = client.resume(self.steps_run if source == "disk" else None)
            if chosen == "memory" and state is not None:
                self._load(state)
                source = "memory"
        self.milestone("resumed", step=self.steps_run, source=source)

    def _load(self, snap: dict[str, Any]) -> None:
        self.model.module.load_state_dict(snap["model"])
        self.optimizer.load_state_dict(snap["optimizer"])
        self.steps_run = int(snap["steps_run"])

    def state(self) -> dict[str, Any]:
        return {"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                "steps_run": self.steps_run}  # fmt: skip

    def milestone(self, what: str, **fields: object) -> None:
        line = {"event": what, "t": time.time(), "rank": self.rank, "generation": self.generation, **fields}
        with self.a.events.open("a") as f:
            f.write(json.dumps(line) + "\n")

    def _fires(self, step: int) -> tuple[int, str] | None:
        """The fault due at this step, claimed (its marker made) by this call."""
        if self.rank != self.a.fault_rank:
            return None
        for i, (at, kind) in enumerate(self.faults):
            if at != step or (self.a.fault_dir / f"fault-{i}").exists():
                continue
            if i and not (self.a.fault_dir / f"fault-{i - 1}").exists():
                return None  # an earlier fault has yet to fire
            try:
                os.close(os.open(self.a.fault_dir / f"fault-{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return None
            return i, kind
        return None

    def _fault(self, step: int) -> None:
        due = self._fires(step)
        if due is None:
            return
        index, kind = due
        self.milestone("fault", index=index, kind=kind, step=step)
        print(f"injecting fault {index} ({kind}) at step {step}", flush=True)
        if kind == "hang":
            while True:
                time.sleep(3600)
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(NCCL_TIMEOUT if kind == "nccl" else f"injected fault at step {step}")

    def train(self, client: Client) -> None:
        first = True
        for step in range(self.steps_run, self.a.steps):
            self._fault(step)
            g = torch.Generator().manual_seed(step * 1000 + self.rank)
            x = torch.randn(64, 16, generator=g)
            self.optimizer.zero_grad()
            torch.nn.functional.mse_loss(self.model(x), x.sum(dim=1, keepdim=True) * 0.1).backward()
            self.optimizer.step()
            time.sleep(self.a.step_time)
            self.steps_run = step + 1
            client.step(self.steps_run)
            if first:
                self.milestone("first_step", step=step)
                first = False
            if self.a.memory_snapshots:
                client.snapshot(self.state(), self.steps_run)
            if self.rank == 0 and self.steps_run % self.a.save_every == 0:
                snap = self.state()
                tmp = self.a.snapshot.with_name(self.a.snapshot.name + ".tmp")
                torch.save(snap, tmp)
                os.replace(tmp, self.a.snapshot)
                client.saved()


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--save-every", type=int, default=20)
    p.add_argument("--snapshot", type=Path, required=True)
    p.add_argument("--faults", default="")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-dir", type=Path, required=True)
    p.add_argument("--client", choices=["ft", "nvrx", "none"], default="none")
    p.add_argument("--pg-timeout", type=float, default=30.0)
    p.add_argument("--events", type=Path, required=True)
    p.add_argument("--memory-snapshots", action="store_true", help="client.snapshot every step (--client ft)")
    a = p.parse_args(argv)
    if a.memory_snapshots and a.client != "ft":
        p.error("--memory-snapshots needs --client ft")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.pg_timeout))
    client = Client(a.client)
    try:
        job = Job(a, client)
        job.train(client)
        job.milestone("done", steps=job.steps_run)
    finally:
        client.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
