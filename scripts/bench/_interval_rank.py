"""The checkpoint-interval benchmark's rank: torch-free, one rank that steps, saves, fails.

    _interval_rank.py STATE_DIR WORK STEP_TIME SAVE_TIME MTBF SEED POLICY [BURST]

The job is WORK seconds of steps of STEP_TIME. A save takes SAVE_TIME (in a
``checkpointing`` section) and then records the step reached in STATE_DIR/ckpt;
every generation resumes from it. POLICY says when to save, counted from one
save's start (or the generation's start) to the next: a number of seconds, or
``advised:INITIAL`` (follow ``client.advised_checkpoint_interval()``, asked after
every save, and INITIAL seconds while the daemon has no advice). Generation g
fails (exits 1 at once, losing the steps since the last save) after an
exponential time of mean MTBF seconds from its start, drawn from SEED and g: the
same failures for every policy. Each question's round trip (µs) is appended to
STATE_DIR/asks; once the work is done, the rank asks BURST (0) more times back to
back, into STATE_DIR/burst.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

from supervisor import client


def ask(into: Path) -> float | None:
    t0 = time.perf_counter()
    seconds = client.advised_checkpoint_interval()
    with into.open("a") as f:
        f.write(f"{(time.perf_counter() - t0) * 1e6:.1f}\n")
    return seconds


def main() -> None:
    state, work, step_time, save_time, mtbf, seed, policy = sys.argv[1:8]
    burst = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    ckpt, asks = Path(state) / "ckpt", Path(state) / "asks"
    gen = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    fail_at = time.monotonic() + random.Random(f"{seed}-{gen}").expovariate(1 / float(mtbf))
    advised = policy.startswith("advised:")
    initial = float(policy.partition(":")[2]) if advised else float(policy)

    def run_for(seconds: float) -> None:
        """Sleep as the work would take; fail on the way when it is time."""
        if time.monotonic() + seconds >= fail_at:
            time.sleep(max(0.0, fail_at - time.monotonic()))
            os._exit(1)
        time.sleep(seconds)

    def interval() -> float:
        seconds = ask(asks) if advised else None
        return initial if seconds is None else seconds

    steps = round(float(work) / float(step_time))
    step = int(ckpt.read_text()) if ckpt.exists() else 0
    every, last_save = interval(), time.monotonic()
    while step < steps:
        run_for(float(step_time))
        step += 1
        client.report_iteration(step)
        if time.monotonic() - last_save >= every and step < steps:
            last_save = time.monotonic()
            with client.section("checkpointing"):
                run_for(float(save_time))
                tmp = ckpt.with_suffix(".tmp")
                tmp.write_text(str(step))
                tmp.replace(ckpt)
            client.report_checkpoint("saved")
            every = interval()
    for _ in range(burst):
        ask(Path(state) / "burst")


if __name__ == "__main__":
    main()
