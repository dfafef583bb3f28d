"""Preloaded by a standby rank (``--preload ...,_cuda_context``; scripts/bench/restart.py's
ft-cuda-warm): create the CUDA context and the cuBLAS handle on the rank's GPU before
its go, so that a restart does not wait for them. Importing it does the work."""

from __future__ import annotations

import os

import torch

if torch.cuda.is_available():
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    a = torch.ones(8, 8, device="cuda")
    (a @ a).sum().item()  # the context, the caching allocator's first block, cuBLAS
    del a
