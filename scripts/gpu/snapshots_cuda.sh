#!/usr/bin/env bash
# One pass on a GPU machine (issue 25): in-memory snapshots of CUDA state. The unit tests of
# the asynchronous copy, the DDP job SIGKILLed mid-run that resumes bit for bit (its cuda
# case), and scripts/bench/snapshots.py on the GPU (100 MB, 1 GB and 12 GB: a billion
# parameters with Adam's two moments, float32). Results under $OUT (default ./gpu-out).
# Python packages the machine lacks come as wheels in .whl (pip download ... --python-version
# 3.12: orjson, pyzmq, google-re2, pytest-asyncio, and this project's own wheel).
# SIZES (MB, comma-separated) and DEVICE (cuda) may be set: DEVICE=cpu tries the script here.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
stage() { echo; echo "=== $1 ($(date -u +%T))"; }

stage "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nproc; free -g | head -2; df -h /dev/shm | tail -1
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())"

stage "install"
if [ -d .whl ] && [ "${INSTALL:-1}" = 1 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    # a .pth, not PYTHONPATH: the bench gives its processes a PYTHONPATH of its own
    echo /tmp/site > "$(python3 -c 'import site; print(site.getsitepackages()[0])')/ft-gpu-site.pth"
    export PYTHONPATH=$PWD PATH=/tmp/site/bin:$PATH
fi

if [ "${TESTS:-1}" = 1 ]; then
stage "tests: the asynchronous copy, the DDP job resumed bit for bit (cuda)"
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 0 -rs tests/unit/test_snapshot_cuda.py \
    "tests/integration/test_snapshot_ddp.py::test_a_sigkilled_ddp_rank_resumes_from_memory_bit_for_bit[${DEVICE:-cuda}]" \
    > "$OUT/tests.txt" 2>&1
grep -E "passed|failed|Error|error:|^E " "$OUT/tests.txt" | tail -30
fi

[ "${BENCH:-1}" = 0 ] && { stage "done"; exit 0; }
if [ "${BENCH:-1}" = slots ]; then  # restore() of 1 GB without the daemon: mapped, and premapped
    timeout 200 python3 scripts/bench/snapshots.py --layer slots --device "${DEVICE:-cuda}" --sizes 100 \
        --rounds 1 --steps 5 --restore-mb 1024 --timeout 190 --out /tmp/snapslots
    stage "done"; exit 0
fi
stage "bench: snapshot() on the training thread, the step with and without, restore()"
timeout 330 python3 scripts/bench/snapshots.py --device "${DEVICE:-cuda}" --sizes "${SIZES:-100,1024,11444}" \
    --rounds 2 --steps 10 --step-ms 200 --restore-mb 1024 --no-baseline --snapshot-memory 0.6 \
    --timeout 320 --out /tmp/snapbench
cp /tmp/snapbench/snapshots/result.json "$OUT/snapshots.json" 2>/dev/null
tail -40 /tmp/snapbench/snapshots/logs/*/*.log 2>/dev/null | tail -60 > "$OUT/daemon-tail.txt"
stage "done"
