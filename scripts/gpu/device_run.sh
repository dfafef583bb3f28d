#!/usr/bin/env bash
# One pass on a GPU machine (issue 17): the failure captures, CUDA's start-up costs and
# the restart benchmark on CUDA, each bounded; results under $OUT (default ./gpu-out).
# Python packages the machine lacks come as wheels in .whl (pip download ... --python-version
# 3.12: orjson, pyzmq, google-re2, py-spy, and this project's own wheel).
# FAULTS=oom,hang (default: every fault) picks the captures; BENCH=0 skips the benchmarks.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
stage() { echo; echo "=== $1 ($(date -u +%T))"; }

stage "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 --version
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.cuda.is_available())"

stage "install"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
mkdir -p /tmp/bin
bindir=$(python3 -c "import os, sys; print(os.path.dirname(sys.executable))")
ln -sf "$bindir/torchrun" /tmp/bin/torchrun
ln -sf /tmp/site/bin/ft-supervisor /tmp/bin/ft-supervisor
ft-supervisor --version || true

stage "failure captures"
timeout 260 python3 scripts/gpu/capture.py /tmp/capture --timeout 60 --daemon ft-supervisor \
    ${FAULTS:+--faults "$FAULTS"}
tar -czf "$OUT/capture.tgz" -C /tmp capture
[ "${BENCH:-1}" = 0 ] && { stage "done"; exit 0; }

stage "CUDA start-up costs"
timeout 120 python3 scripts/bench/cuda_costs.py --runs 3 --json "$OUT/cuda_costs.json"

stage "restart on CUDA"
timeout 240 python3 scripts/bench/restart.py --device cuda --backend gloo --runs 3 \
    --variants torchrun-noshare,ft,ft-cold,ft-cuda-warm --crash-at-step 100 --steps-after 20 \
    --timeout 60 --bin-dir /tmp/bin --out /tmp/restart
tar -czf "$OUT/restart.tgz" -C /tmp --exclude='*.pt' restart
stage "done"
