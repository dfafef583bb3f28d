"""What CUDA adds to a rank's start, and what a standby that makes its CUDA context
early costs the ranks that train beside it. Needs a GPU and torch with CUDA.

    python scripts/bench/cuda_costs.py [--runs 5]

Start-up: each run is a fresh ``python`` that times, in order, ``import torch``,
``torch.cuda.init()``, the CUDA context (the first tensor on the GPU), placing a
small model (the restart benchmark's) and making its SGD optimizer (``place_model``:
torch.optim imports torch._dynamo on first use, most of that phase), its first
training step (cuBLAS and the kernels load), a second step, and an NCCL process
group of one rank with its first all_reduce. GPU memory is NVML's figure for the
whole device, before the process and after each phase (nothing else may use the GPU
meanwhile). Medians over the runs.

Interference: one process trains (bf16 4096x4096 matrix products, a step at a time,
synchronised); a second, like a standby rank with ``--preload ..._cuda_context``,
creates its context and cuBLAS handle while the first trains, then idles holding them.
The trainer's median step time alone, during the standby's start and while it idles.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = r"""
import json, os, sys, time
t0 = time.perf_counter()
def nvml_used():
    import pynvml
    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used / 2**20
base = nvml_used()
out = {}
def mark(name, t):
    out[name + "_s"] = round(time.perf_counter() - t, 4)
    out[name + "_mb"] = round(nvml_used() - base)
    return time.perf_counter()
t = time.perf_counter()
import torch, torch.distributed as dist
t = mark("import_torch", t)
torch.cuda.init()
t = mark("cuda_init", t)
torch.empty(1, device="cuda")
torch.cuda.synchronize()
t = mark("context", t)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
torch.cuda.synchronize()
t = mark("place_model", t)
def step():
    x = torch.randn(64, 16, device="cuda")
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    loss.backward(); opt.step(); opt.zero_grad()
    torch.cuda.synchronize()
step()
t = mark("first_step", t)
step()
t = mark("second_step", t)
store = dist.TCPStore("127.0.0.1", 0, 1, True)
dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
x = torch.ones(1024, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
t = mark("nccl_first_all_reduce", t)
dist.destroy_process_group()
out["total_s"] = round(time.perf_counter() - t0, 4)
print(json.dumps(out))
"""

TRAINER = r"""
import json, sys, time, torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
steps = []
end = time.time() + float(sys.argv[1])
while time.time() < end:
    t = time.time()
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    steps.append((t, time.time() - t))
print(json.dumps(steps))
"""

STANDBY = r"""
import json, sys, time
t = time.time()
import torch
a = torch.ones(8, 8, device="cuda"); (a @ a).sum().item()
print(json.dumps({"began": t, "ready": time.time()}), flush=True)
time.sleep(float(sys.argv[1]))
"""

PHASES = ("import_torch", "cuda_init", "context", "place_model", "first_step", "second_step",
          "nccl_first_all_reduce")  # fmt: skip


def startup(runs: int) -> list[dict[str, float]]:
    found = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                              check=False)  # fmt: skip
        if done.returncode != 0:
            print(f"probe failed ({done.returncode}): {done.stderr[-2000:]}", file=sys.stderr)
            continue
        found.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return found


def interference(seconds: float = 12.0) -> dict[str, float | None]:
    with tempfile.TemporaryDirectory() as tmp:
        trainer_out = Path(tmp) / "trainer.json"
        with trainer_out.open("w") as sink:
            trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(seconds)], stdout=sink)
            time.sleep(seconds / 3)  # the trainer's steps alone first
            standby = subprocess.run([sys.executable, "-c", STANDBY, str(seconds / 3)], capture_output=True,
                                     text=True, timeout=120, check=False)  # fmt: skip
            trainer.wait(timeout=120)
        steps = json.loads(trainer_out.read_text())
    marks = json.loads(standby.stdout.strip().splitlines()[0]) if standby.returncode == 0 else None
    if marks is None:
        return {"alone_ms": None, "standby_starting_ms": None, "standby_idle_ms": None}
    began, ready = marks["began"], marks["ready"]
    idle_end = ready + seconds / 3

    def med(pick: list[float]) -> float | None:
        return round(statistics.median(pick) * 1000, 2) if pick else None

    return {
        "alone_ms": med([d for t, d in steps if t + d < began or t > idle_end]),
        "standby_starting_ms": med([d for t, d in steps if began <= t and t + d <= ready]),
        "standby_idle_ms": med([d for t, d in steps if ready <= t and t + d <= idle_end]),
        "standby_start_s": round(ready - began, 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = p.parse_args()
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
    runs = startup(a.runs)
    print(f"| phase (fresh process, median of {len(runs)}) | seconds | min-max | GPU memory after, MiB |")
    print("|---|---|---|---|")
    for phase in (*PHASES, "total"):
        xs = [r[f"{phase}_s"] for r in runs if f"{phase}_s" in r]
        mb = [r[f"{phase}_mb"] for r in runs if f"{phase}_mb" in r]
        if xs:
            mem = f"{statistics.median(mb):.0f}" if mb else ""
            print(f"| {phase} | {statistics.median(xs):.3f} | {min(xs):.3f}-{max(xs):.3f} | {mem} |")
    inter = interference()
    print()
    print("| trainer's step (20 bf16 4096^2 products) | ms |")
    print("|---|---|")
    for key, value in inter.items():
        print(f"| {key} | {value} |")
    if a.json is not None:
        a.json.write_text(json.dumps({"startup": runs, "interference": inter}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
