#!/usr/bin/env bash
# The demo: a real 2-rank training run (torch, gloo, CPU) in which rank 1 crashes
# once, at step 150 (7.5 s into training: the standby ranks, started once the ranks
# stepped, are ready by then). ft-supervisor notices the exit at once, stops rank 0,
# starts generation 1 from warm standby ranks (torch already imported) on a fresh port,
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
    scripts/train.py --steps 200 --crash-at-step 150 --snapshot "$out/snapshot.pt"
code=$?
set -e
echo
echo "ft-supervisor exited with $code. What happened, from the event log:"
.venv/bin/python - "$out/logs/demo" <<'PY'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
run_dir = next(root.glob("*/events.jsonl")).parent
events = [json.loads(l) for l in (run_dir / "events.jsonl").read_text().splitlines()]
t0 = events[0]["t_mono"]
started = max(e["generation"] for e in events if e["event"] == "generation_started")
shown = {
    "generation_started": ("generation", "standby_ranks"),
    "rank_failure_reported": ("generation", "rank"),
    "rank_exited": ("generation", "rank", "exit_code", "signal", "state"),
    "decision": ("generation", "action", "reason", "rank", "rule"),
    "rank_stepping": ("generation", "rank", "iteration"),
    "generation_ended": ("generation", "verdict", "iteration"),
    "run_finished": ("exit_code", "restarts_used"),
}
for e in events:
    # the next generation's standby ranks, stopped unused at the end, are no part of the story
    if e["event"] in shown and not (e["event"] == "rank_exited" and e["generation"] > started):
        fields = " ".join(f"{k}={e.get(k)}" for k in shown[e["event"]] if e.get(k) is not None)
        print(f"  +{e['t_mono'] - t0:7.3f}s {e['event']:<22} {fields}")
decision = next(e for e in events if e["event"] == "decision")
print(f"\nthe decision names the root cause: rank {decision['rank']} [{decision['rule']}]")
print(f"run directory: {run_dir}")
PY
echo
# where the run's time went (the failure to every rank stepping again, per incident), and a
# timeline page (open it in a browser)
.venv/bin/ft-supervisor report "$out/logs/demo"
exit $code
