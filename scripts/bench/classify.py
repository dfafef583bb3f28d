"""Classifier benchmark: one pass of the rule chain over a big rank log.

    .venv/bin/python scripts/bench/classify.py              # 100 MB, 5 runs
    .venv/bin/python scripts/bench/classify.py --mb 20 --runs 3

Writes a synthetic but realistic log (training progress lines, NCCL INFO chatter,
warnings, a Python traceback in the middle that is *not* the cause, and an NCCL
watchdog timeout wrapped in a DistBackendError near the end), then runs
``ft-supervisor classify`` on it ``--runs`` times in a fresh process each time and
prints a Markdown table: wall time (median, min-max), throughput, the process's
peak RSS, and the rule found. Next to it, the glue it replaces: ``grep -E`` for
the few strings hand-written launch scripts look for (exit code only, no rule,
no unwrapping), on the same file.
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NOISE = (
    "[rank{r}]: step {i} loss {loss:.4f} lr 3.0e-04 grad_norm {g:.3f} tokens/s 182331",
    "node{r}:1234:1299 [{r}] NCCL INFO Channel 03/32 : {r} -> {n} via P2P/CUMEM/read",
    "[rank{r}]: /usr/lib/python3/site-packages/torch/utils/data/dataloader.py:617: UserWarning: "
    "This DataLoader will create 8 worker processes in total.",
    "[rank{r}]:[W1122 10:{m:02d}:00.000000 ProcessGroupNCCL.cpp:4561] Warning: "
    "TORCH_NCCL_AVOID_RECORD_STREAMS=1",
    "[rank{r}]: checkpoint saved to /ckpt/iter_{i:07d} in 41.2 s",
)
RED_HERRING = """[rank{r}]: Traceback (most recent call last):
[rank{r}]:   File "/workspace/eval.py", line 88, in evaluate
[rank{r}]:     score = metric(pred, gold)
[rank{r}]: ZeroDivisionError: division by zero (caught, evaluation skipped)
"""
CAUSE = """[rank1]:[E1122 11:58:02.512713 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective \
operation timeout: WorkNCCL(SeqNum=918273, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, \
Timeout(ms)=600000) ran for 600081 milliseconds before timing out.
[rank1]:[E1122 11:58:02.513101 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank 1] \
Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation \
timeout: WorkNCCL(SeqNum=918273, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, Timeout(ms)=600000) \
ran for 600081 milliseconds before timing out.
[rank1]: torch.distributed.DistBackendError: [Rank 1] Watchdog caught collective operation timeout
"""


def write_log(path: Path, megabytes: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    target = megabytes << 20
    written = 0
    with path.open("w") as f:
        i = 0
        while written < target:
            if i == 200_000:
                block = RED_HERRING.format(r=rng.randrange(8))
            else:
                block = rng.choice(NOISE).format(
                    r=rng.randrange(8), n=rng.randrange(8), i=i, loss=rng.random() * 3,
                    g=rng.random(), m=i % 60,
                ) + "\n"  # fmt: skip
            f.write(block)
            written += len(block)
            i += 1
            if target - written < 4096 and CAUSE not in block:
                f.write(CAUSE)
                written += len(CAUSE)
                break


def _timed(argv: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB) of the child, its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the max over all children so far: run the biggest last
    return wall, max(peak, before) / 1024, proc.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=100)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--keep", type=Path, default=None, help="write the log here and keep it")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-classify-"))
    log = a.keep or tmp / "rank1.stderr.log"
    write_log(log, a.mb)
    size = log.stat().st_size / (1 << 20)
    ft = str(Path(sys.executable).with_name("ft-supervisor"))
    rows = []
    grep = shutil.which("grep")
    if grep:
        pattern = "DistBackendError|ChildFailedError|NCCL error|Watchdog caught"
        times = [_timed([grep, "-E", "-c", pattern, str(log)])[0] for _ in range(a.runs)]
        rows.append(("grep -E (the bash glue: a match, no rule, no cause)", times, 0.0, "-"))
    times, peaks, rule = [], [], "?"
    for _ in range(a.runs):
        wall, peak, out = _timed([ft, "classify", "--json", str(log)])
        times.append(wall)
        peaks.append(peak)
        rule = out.split('"rule": "')[1].split('"')[0] if '"rule": "' in out else "?"
    rows.append(("ft-supervisor classify (whole rule chain)", times, max(peaks), rule))
    print(f"\nlog: {size:.0f} MiB, {a.runs} runs each, fresh process per run (start-up included)\n")
    print("| tool | median s | min-max s | MiB/s (median) | peak RSS MiB | rule |")
    print("|---|---|---|---|---|---|")
    for name, ts, peak, found in rows:
        med = statistics.median(ts)
        peak_text = f"{peak:.0f}" if peak else "-"
        print(
            f"| {name} | {med:.2f} | {min(ts):.2f}-{max(ts):.2f} | {size / med:.0f} | {peak_text} | {found} |"
        )
    if a.keep is None:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
