#!/usr/bin/env bash
# The demo: a real 2-rank training run (torch, gloo, CPU) in which rank 1 crashes
# once, at step 70. ft-supervisor notices the exit at once, stops rank 0, starts
# generation 1 from warm standby ranks (torch already imported) on a fresh port,
# and the ranks resume from the last snapshot and finish.
#
# Sets up .venv (torch pinned to the CPU build) on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c "import torch, numpy, supervisor" 2>/dev/null; then
    python3 -m venv .venv
    .venv/bin/python -m pip install -q -c constraints.txt -e ".[torch]"
fi
out=demo-output
rm -rf "$out"
mkdir -p "$out"
set +e
.venv/bin/ft-supervisor run --nproc-per-node 2 --max-restarts 3 --log-dir "$out/logs" --rdzv-id demo \
    scripts/train.py --steps 120 --crash-at-step 70 --snapshot "$out/snapshot.pt"
code=$?
set -e
echo
echo "ft-supervisor exited with $code. What happened, from the event log:"
.venv/bin/python - "$out/logs/demo" <<'PY'
import json, sys
from pathlib import Path
events = [json.loads(l) for l in next(Path(sys.argv[1]).glob("*/events.jsonl")).read_text().splitlines()]
t0 = events[0]["t_mono"]
for e in events:
    if e["event"] in ("generation_started", "decision", "generation_ended", "run_finished") or (
        e["event"] == "rank_exited" and e.get("state") == "failed"
    ):
        fields = {k: v for k, v in e.items() if k not in ("event", "t_wall", "t_mono", "run_id")}
        print(f"  +{e['t_mono'] - t0:7.3f}s {e['event']:<18} {fields}")
failed = next(e for e in events if e["event"] == "rank_exited" and e.get("state") == "failed")
started = [e for e in events if e["event"] == "generation_started"]
print(f"\nfrom rank {failed['rank']}'s crash to generation 1's go: "
      f"{(started[1]['t_mono'] - failed['t_mono']) * 1000:.0f} ms (ranks already had torch imported)")
print(f"run directory: {events[0]['run_dir']}")
PY
echo
# where the run's time went, and a timeline page (open it in a browser)
.venv/bin/ft-supervisor report "$out/logs/demo"
exit $code
