"""A rank that fails on a GPU the way training code does, for capture.py.

--fault oom        a few steps, then a 200 GiB tensor: torch.OutOfMemoryError
--fault illegal    a Triton kernel stores 4 TiB past its tensor: an illegal memory access
--fault assert     cross_entropy with a label past the classes: a device-side assert
--fault timeout    NCCL, world size 1, a 5 s timeout: an all_reduce queued behind a 60 s
                   GPU spin; the watchdog times it out and takes the process down
--fault duplicate  NCCL, every rank on GPU 0: ncclInvalidUsage (duplicate GPU)
--fault ordinal    every rank sets device LOCAL_RANK on a node with fewer GPUs
--fault hidden     run with CUDA_VISIBLE_DEVICES naming no GPU: the first CUDA call
--fault hang       NCCL, world size 1: heartbeats stop while an all_reduce waits behind
                   a GPU spin; the daemon's hang bundle asks the Flight Recorder
Each reports its steps through the client, so the daemon knows it had stepped.
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist

from supervisor import client

SPIN_S = 60.0


def steps(n: int, device: torch.device) -> None:
    model = torch.nn.Linear(64, 64).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(1, n + 1):
        loss = model(torch.randn(32, 64, device=device)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        client.report_iteration(i)
        client.heartbeat()


def spin(seconds: float) -> None:
    """Keep the GPU's current stream busy for about ``seconds`` (torch's own spin kernel)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    khz = getattr(props, "clock_rate", 0) or 2_000_000  # an H100/H200 boosts to about 2 GHz
    torch.cuda._sleep(int(seconds * khz * 1000))


def illegal_access() -> None:
    import triton  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415

    @triton.jit
    def poke(ptr, offset):  # type: ignore[no-untyped-def]
        tl.store(ptr + offset, 1.0)

    x = torch.zeros(1, device="cuda")
    poke[(1,)](x, 1 << 40)
    torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", required=True)
    a = p.parse_args()
    client.init()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if a.fault in ("hidden", "ordinal"):
        torch.cuda.set_device(local)  # no GPU at all; rank 1 of a one-GPU node
        steps(100_000, torch.device("cuda", local))  # the rank that has a GPU trains on until stopped
    if a.fault in ("timeout", "duplicate", "hang"):
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        timeout = datetime.timedelta(seconds=5 if a.fault == "timeout" else 600)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        steps(3, device)
        t = torch.ones(1024, device=device)
        if a.fault == "duplicate":
            dist.all_reduce(t)
            torch.cuda.synchronize()
        spin(SPIN_S)
        dist.all_reduce(t)
        # the host waits for the GPU, in CUDA's code: no heartbeat, no step. The NCCL
        # watchdog ends the process first (timeout), or the daemon's hang detection (hang)
        torch.cuda.synchronize()
        return
    device = torch.device("cuda", 0)
    steps(3, device)
    if a.fault == "oom":
        torch.empty(200 * 2**30, dtype=torch.uint8, device=device)
    elif a.fault == "illegal":
        illegal_access()
    elif a.fault == "assert":
        logits = torch.randn(16, 10, device=device)
        labels = torch.full((16,), 12, device=device)
        torch.nn.functional.cross_entropy(logits, labels).item()
    raise SystemExit(f"fault {a.fault} did not fail")


if __name__ == "__main__":
    main()
