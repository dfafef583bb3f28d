"""A small real training run: DDP over gloo on CPU, with snapshot save and resume.

``--device cuda`` puts the model and batches on the rank's GPU (LOCAL_RANK, modulo
the GPUs it sees: several ranks may share one); ``--backend nccl`` all-reduces with
NCCL, which needs a GPU per rank (gloo all-reduces CUDA tensors too).

Runs unchanged under ``torchrun`` and ``ft-supervisor run``. As in the OSMO
rescheduling guide (seed 000), the script can start from scratch or resume from
its last snapshot, so a restarted generation picks up where the last one
stopped instead of starting over.

Faults can be injected, once, for demos and tests:
    --crash-at-step N --crash-rank R   rank R raises at step N
    --crash-generations SPEC           ... in these generations: G, A-B or all
                                       (default 0: only the first)
    --crash-mode raise|exit|abort|segv how it dies
--plain averages the gradients with one all_reduce each and steps SGD by hand, without
DDP and torch.optim: both import torch._dynamo (800 modules, about 2 CPU-s a rank), which
a test of the ranks' world (not of DDP) need not pay in every rank of every generation.
--heartbeat sends a heartbeat every step, for the daemon's heartbeat timeout.
--memory-snapshot-mb MB (under ft-supervisor) hands the model, the optimizer and MB of ballast
to the daemon every step (``client.snapshot``) and takes them back at start
(``client.restore``, newer than the disk snapshot): a ``restored`` milestone says the step,
the seconds restore() took and how it read the slot (a standby's premapped view or not).
--no-premap (benchmarks) drops a standby's premapped slots before restore(): the restore and
the first snapshots as they were before standbys mapped their slots ahead of their go.
--hold-only (with --memory-snapshot-mb) holds the same ballast but never snapshots or restores
it: the same job without memory snapshots.
Progress is printed every --print-every steps; --events FILE appends one JSON
line per milestone (first step of a generation, crash, done) for benchmarks, and where a
restart's time goes on the rank's side: ``started`` (the process group made), ``loaded``
(the model built, the disk snapshot loaded), ``allocated`` (the ballast), ``stepped`` (the
first step computed, before its memory snapshot; ``first_step`` comes after it).
Under ft-supervisor it also reports iterations and checkpoints through the client
(fire and forget, about a microsecond), which the run report turns into time lost
per incident; under torchrun those calls are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

try:
    from supervisor import client
    from supervisor.client import snapshots
except ImportError:  # the script also runs where ft-supervisor is not installed
    client = None  # type: ignore[assignment]

SUPERVISED = client is not None and client.is_active()


def _generations(spec: str) -> range:
    if spec == "all":
        return range(1 << 30)
    first, _, last = spec.partition("-")
    return range(int(first), int(last or first) + 1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-time", type=float, default=0.05, help="seconds per step (sleep)")
    p.add_argument("--snapshot", type=Path, default=None, help="snapshot file to save/resume")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--print-every", type=int, default=10)
    p.add_argument("--crash-at-step", type=int, default=None)
    p.add_argument("--crash-rank", type=int, default=1)
    p.add_argument("--crash-generations", type=_generations, default=_generations("0"))
    p.add_argument("--crash-mode", choices=["raise", "exit", "abort", "segv"], default="raise")
    p.add_argument("--plain", action="store_true", help="all_reduce and SGD by hand, without DDP")
    p.add_argument("--heartbeat", action="store_true", help="a heartbeat every step (hang detection)")
    p.add_argument("--events", type=Path, default=None, help="append milestones as JSON lines")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    p.add_argument("--memory-snapshot-mb", type=float, default=0.0, help="client.snapshot every step")
    p.add_argument("--no-premap", action="store_true", help="restore without a standby's premap")
    p.add_argument("--hold-only", action="store_true", help="hold the ballast, never snapshot it")
    return p.parse_args(argv)


class Plain:
    """--plain: DDP's gradient averaging and torch.optim.SGD's step, by hand."""

    def __init__(self, module: torch.nn.Module, lr: float) -> None:
        self.module, self.lr = module, lr

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.module.parameters())

    def zero_grad(self) -> None:
        self.module.zero_grad()

    def step(self) -> None:
        world = dist.get_world_size()
        with torch.no_grad():
            for p in self.module.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.sub_(p.grad, alpha=self.lr / world)

    def state_dict(self) -> dict[str, object]:
        return {}

    def load_state_dict(self, state: dict[str, object]) -> None:
        pass


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = dist.get_rank()
        self.generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self._milestone("started")
        torch.manual_seed(0)
        self.device = torch.device("cpu")
        if args.device == "cuda":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            self.device = torch.device("cuda", local % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.step_times: list[float] = []  # wall time of each step, for the crash milestone
        self.model: DistributedDataParallel | Plain
        self.optimizer: torch.optim.Optimizer | Plain
        if args.plain:
            self.model = self.optimizer = Plain(model.to(self.device), lr=0.05)
        else:
            self.model = DistributedDataParallel(model.to(self.device))
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.steps_run = 0
        if args.snapshot is not None and args.snapshot.exists():
            self._load_snapshot(args.snapshot)
        self._milestone("loaded")
        self.ballast: torch.Tensor | None = None
        self.held: torch.Tensor | None = None  # --hold-only: the same ballast, not snapshotted
        if args.memory_snapshot_mb > 0 and SUPERVISED:
            ballast = torch.zeros(int(args.memory_snapshot_mb * 2**20) // 4)
            self._milestone("allocated")
            if args.hold_only:
                self.held = ballast
            else:
                self.ballast = ballast
                self._restore_memory()

    def _restore_memory(self) -> None:
        if self.args.no_premap:
            premap = sys.modules.get(snapshots.PREMAP)
            if premap is not None:
                premap.release()  # unmapped: restore() maps the slot itself, as before
        began = time.perf_counter()
        held = client.restore()
        seconds = time.perf_counter() - began
        self._milestone("restored", step=None if held is None else held[0], seconds=seconds,
                        served=snapshots.restored_from())  # fmt: skip
        if held is None or held[1]["steps_run"] < self.steps_run:
            return  # nothing held, or older than the disk snapshot
        state = held[1]
        self.model.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"])
        self.ballast, self.steps_run = state["ballast"], state["steps_run"]
        print(f"resuming from memory at step {self.steps_run} ({seconds * 1000:.0f} ms)", flush=True)

    def _snapshot_memory(self) -> None:
        assert self.ballast is not None
        self.ballast[0] = self.steps_run
        state = {"model": self.model.module.state_dict(), "optim": self.optimizer.state_dict(),
                 "ballast": self.ballast, "steps_run": self.steps_run}  # fmt: skip
        client.snapshot(state, self.steps_run)

    def _load_snapshot(self, path: Path) -> None:
        snapshot = torch.load(path, map_location=self.device)
        self.model.module.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.steps_run = snapshot["STEPS_RUN"]
        print(f"resuming from snapshot at step {self.steps_run}", flush=True)
        if SUPERVISED:
            client.report_checkpoint("loaded")

    def _save_snapshot(self) -> None:
        path = self.args.snapshot
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            "STEPS_RUN": self.steps_run,
        }
        tmp = path.with_name(path.name + ".tmp")
        torch.save(snapshot, tmp)
        os.replace(tmp, path)  # a crash mid-save never leaves a torn snapshot

    def _batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(step * 1000 + self.rank)
        x = torch.randn(64, 16, generator=g)
        return x.to(self.device), (x.sum(dim=1, keepdim=True) * 0.1).to(self.device)

    def _milestone(self, what: str, **fields: object) -> None:
        if self.args.events is None:
            return
        line = json.dumps(
            {"event": what, "t": time.time(), "rank": self.rank, "generation": self.generation, **fields}
        )
        with self.args.events.open("a") as f:
            f.write(line + "\n")

    def _maybe_crash(self, step: int) -> None:
        a = self.args
        if a.crash_at_step != step or a.crash_rank != self.rank:
            return
        if self.generation not in a.crash_generations:
            return
        print(f"injecting a fault at step {step} ({a.crash_mode})", flush=True)
        times = sorted(self.step_times)
        self._milestone("crash", step=step, step_s=times[len(times) // 2] if times else None)
        if a.crash_mode == "exit":
            os._exit(13)
        if a.crash_mode == "abort":
            os.abort()
        if a.crash_mode == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        raise RuntimeError(f"injected fault at step {step} on rank {self.rank}")

    def train(self) -> float:
        loss = torch.tensor(0.0)
        first = True
        for step in range(self.steps_run, self.args.steps):
            self._maybe_crash(step)
            began = time.monotonic()
            x, y = self._batch(step)
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            if self.device.type == "cuda":
                torch.cuda.synchronize()  # the step's GPU work counts in its time
            time.sleep(self.args.step_time)
            self.step_times.append(time.monotonic() - began)
            self.steps_run = step + 1
            if first:
                self._milestone("stepped", step=step)
            if SUPERVISED:
                client.report_iteration(self.steps_run)
                if self.ballast is not None:
                    self._snapshot_memory()
                if self.args.heartbeat:
                    client.heartbeat()
            if first:
                self._milestone("first_step", step=step)
                first = False
            if (
                self.rank == 0
                and self.args.snapshot is not None
                and self.steps_run % self.args.save_every == 0
            ):
                self._save_snapshot()
                if SUPERVISED:
                    client.report_checkpoint("saved")
            if self.rank == 0 and self.steps_run % self.args.print_every == 0:
                print(
                    f"generation {self.generation} step {self.steps_run}/{self.args.steps} "
                    f"loss {loss.item():.4f}",
                    flush=True,
                )
        return float(loss.item())


@record
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    dist.init_process_group(args.backend)
    trainer = Trainer(args)
    loss = trainer.train()
    trainer._milestone("done", loss=loss)
    if trainer.rank == 0:
        print(f"training finished: {args.steps} steps, final loss {loss:.4f}", flush=True)
    # On success only. A rank that raises keeps its process group until it exits, after
    # @record wrote its error file: destroyed on the way out (a `finally`), it would fail
    # its peers' pending all_reduce first, and a peer's error file could then be written
    # before the failing rank's own, naming the peer the root cause (seen with --plain).
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
