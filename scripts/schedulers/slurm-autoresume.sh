#!/usr/bin/env bash
# The auto-resume loop: relaunch training until it is finished, the failure budget is
# spent, or a failure says retrying cannot help. Under SLURM (sbatch this file) each
# retry is a requeue, so the scheduler may place it on other nodes; outside SLURM it
# loops in place, which is also how the test suite runs it.
#
#   sbatch --nodes 4 scripts/schedulers/slurm-autoresume.sh train.py --lr 3e-4
#   MAX_FAILURES=5 bash scripts/schedulers/slurm-autoresume.sh train.py
#
# ft-supervisor's exit codes (DESIGN.md): 0 done, 2 abort (not retryable), 200
# reschedule (run elsewhere), 128+N stopped by signal N, 1 the daemon's own error.
#
#SBATCH --requeue
#SBATCH --open-mode=append
# SIGTERM reaches the batch shell 120 s before the time limit: enough for the dying-gasp
# save (--save-timeout) and the final checkpoint sync before SLURM kills the step.
#SBATCH --signal=B:TERM@120
set -uo pipefail

: "${FAULT_TOL_FINISHED_FLAG_FILE:=$PWD/ft-supervisor.finished}"
export FAULT_TOL_FINISHED_FLAG_FILE
MAX_FAILURES=${MAX_FAILURES:-3}        # attempts that may fail before the loop gives up
ABORT_CODE=${ABORT_CODE:-2}
FT_SUPERVISOR=${FT_SUPERVISOR:-ft-supervisor}
# the failure count survives requeues: it lives beside the flag, on shared storage
COUNT_FILE=${COUNT_FILE:-$FAULT_TOL_FINISHED_FLAG_FILE.failures}

launch() {
    if [ -n "${SLURM_JOB_ID:-}" ] && [ "${SLURM_NNODES:-1}" -gt 1 ]; then
        # one daemon per node; they find each other through torch's c10d rendezvous
        head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
        srun --kill-on-bad-exit=0 --ntasks-per-node=1 "$FT_SUPERVISOR" run --autoresume \
            --nnodes "$SLURM_NNODES" --rdzv-backend c10d --rdzv-endpoint "$head:29400" \
            --rdzv-id "$SLURM_JOB_ID" "$@" &
    else
        "$FT_SUPERVISOR" run --autoresume "$@" &
    fi
    child=$!
    # the batch shell gets SLURM's warning signal: pass it on, the daemon saves and stops
    trap 'kill -TERM "$child" 2>/dev/null' TERM
    wait "$child"
    local code=$?
    # wait returns early (>128) when the trap ran; the daemon's own code comes after
    if kill -0 "$child" 2>/dev/null; then wait "$child"; code=$?; fi
    trap - TERM
    return "$code"
}

while true; do
    if [ -e "$FAULT_TOL_FINISHED_FLAG_FILE" ]; then
        echo "auto-resume: training finished ($FAULT_TOL_FINISHED_FLAG_FILE exists)"
        exit 0
    fi
    launch "$@"
    code=$?
    if [ -e "$FAULT_TOL_FINISHED_FLAG_FILE" ] || [ "$code" -eq 0 ]; then
        echo "auto-resume: training finished"
        exit 0
    fi
    if [ "$code" -eq "$ABORT_CODE" ]; then
        echo "auto-resume: abort (exit $code): retrying cannot help; see reason.json" >&2
        exit "$code"
    fi
    failures=$(( $(cat "$COUNT_FILE" 2>/dev/null || echo 0) + 1 ))
    echo "$failures" > "$COUNT_FILE"
    if [ "$failures" -ge "$MAX_FAILURES" ]; then
        echo "auto-resume: $failures failed attempt(s), the budget ($MAX_FAILURES) is spent" >&2
        exit "$code"
    fi
    echo "auto-resume: attempt failed (exit $code), $failures of $MAX_FAILURES; resuming" >&2
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        # a requeue lets SLURM place the job elsewhere: what a reschedule (200) asks for
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
done
