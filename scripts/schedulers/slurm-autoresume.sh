#!/usr/bin/env bash
# The auto-resume recipe for SLURM: relaunch training until it is finished, the failure
# budget is spent, or a failure says retrying cannot help. Under SLURM (sbatch this file)
# each retry is a requeue of the same job; outside SLURM it loops in place, which is also
# how the quick tests run it. The guide, and what was tested on a real slurmctld/slurmd:
# docs/guides/slurm.md.
#
#   sbatch --nodes 4 scripts/schedulers/slurm-autoresume.sh --nproc-per-node 8 train.py
#   MAX_FAILURES=5 bash scripts/schedulers/slurm-autoresume.sh train.py
#
# What each exit code of `ft-supervisor run` (README, "Exit codes") makes of the job:
#   0      training finished (or the finished flag exists): the job ends, COMPLETED
#   2      abort, retrying cannot help: the job ends without a requeue (exit 2, FAILED)
#   200    reschedule: the node that asked is added to the job's ExcNodeList and the job
#          is requeued, so SLURM starts it again on other nodes, where it resumes from its
#          checkpoint (counted against MAX_FAILURES)
#   other  (1, the daemon's own error) requeued as it is, counted against MAX_FAILURES
# and the signals the batch shell gets (each passed on to the daemon as SIGTERM, so the
# ranks get the dying-gasp save, then stop):
#   USR1   the time limit is near (--signal below): the job is requeued as it is, not counted
#   TERM   `scancel --batch --signal=TERM JOB`: stop with a save; the job ends (exit 143)
#
# Several nodes: one daemon per node through srun, meeting at a c10d rendezvous on the
# job's first node. When one node's daemon exits (a reschedule, an abort, a failure), the
# daemons of the other nodes are told to stop (SIGTERM, within a second): their ranks
# save and stop, and the whole job is requeued without the node that asked. Without that
# they would wait `join_timeout` (600 s) for a replacement node that SLURM never sends.
#
#SBATCH --requeue
#SBATCH --open-mode=append
# SIGUSR1 reaches the batch shell (B:) 120 s before the time limit: the daemons save and
# stop (--save-timeout, 60 s), the final checkpoint sync runs (--checkpoint-final-timeout),
# and the job is requeued. Make the 120 s cover that for your job.
#SBATCH --signal=B:USR1@120
set -uo pipefail

: "${FAULT_TOL_FINISHED_FLAG_FILE:=$PWD/ft-supervisor.finished}"
export FAULT_TOL_FINISHED_FLAG_FILE
MAX_FAILURES=${MAX_FAILURES:-3}        # attempts that may fail before the recipe gives up
ABORT_CODE=${ABORT_CODE:-2}
RESCHEDULE_CODE=${RESCHEDULE_CODE:-200}
FT_SUPERVISOR=${FT_SUPERVISOR:-ft-supervisor}
# several nodes: the c10d store, by default hosted by the daemon on the job's first node;
# RDZV_ENDPOINT=host:port names a store of your own (README, "Several nodes": the caveat)
RDZV_PORT=${RDZV_PORT:-29400}
RDZV_ENDPOINT=${RDZV_ENDPOINT:-}
# what survives a requeue lives beside the flag, on storage every node shares: the
# failure count, the nodes that asked to be rescheduled, each node's last exit code
COUNT_FILE=${COUNT_FILE:-$FAULT_TOL_FINISHED_FLAG_FILE.failures}
BAD_NODES_FILE=${BAD_NODES_FILE:-$FAULT_TOL_FINISHED_FLAG_FILE.bad-nodes}
CODES_DIR=${CODES_DIR:-$FAULT_TOL_FINISHED_FLAG_FILE.codes}

# One node's daemon under srun. Its exit code goes to CODES_DIR/code.<node>, so the batch
# shell knows which node asked for what (srun's own code says neither). While it runs, a
# watcher looks once a second for another node's non-zero code or the batch shell's
# CODES_DIR/stop, and then stops this node's daemon with SIGTERM: its ranks save, then
# stop. Not srun --kill-on-bad-exit, nor a signal to srun: either cancels the step, which
# signals every process in it, ranks included, and a rank killed so saves nothing.
# shellcheck disable=SC2016
NODE_TASK='
"$FT_SUPERVISOR" run --autoresume "$@" &
child=$!
(
    while kill -0 "$child" 2>/dev/null; do
        if [ -e "$CODES_DIR/stop" ] || grep -sqvx 0 "$CODES_DIR"/code.*; then
            echo "auto-resume: node $SLURMD_NODENAME: stopping ($(cd "$CODES_DIR" && grep -sH . stop code.* | paste -sd " " -))" >&2
            kill -TERM "$child" 2>/dev/null
            exit
        fi
        sleep 1
    done
) &
wait "$child"; code=$?
echo "$code" > "$CODES_DIR/.$SLURMD_NODENAME" && mv "$CODES_DIR/.$SLURMD_NODENAME" "$CODES_DIR/code.$SLURMD_NODENAME"
exit "$code"
'

launch() {
    several=""
    if [ -n "${SLURM_JOB_ID:-}" ] && [ "${SLURM_NNODES:-1}" -gt 1 ]; then
        several=1
        local head addr
        if [ -z "$RDZV_ENDPOINT" ]; then
            head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
            # the address SLURM reaches the node at (NodeAddr): its name on most clusters
            addr=$(scontrol show node "$head" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')
            RDZV_ENDPOINT="${addr:-$head}:$RDZV_PORT"
        fi
        mkdir -p "$CODES_DIR" && rm -f "$CODES_DIR"/code.* "$CODES_DIR"/stop
        export FT_SUPERVISOR CODES_DIR
        srun --kill-on-bad-exit=0 --ntasks-per-node=1 bash -c "$NODE_TASK" ft-node \
            --nnodes "$SLURM_NNODES" --rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT" \
            --rdzv-id "$SLURM_JOB_ID" "$@" &
    else
        "$FT_SUPERVISOR" run --autoresume "$@" &
    fi
    child=$!
    # the batch shell gets SLURM's warning or the user's signal: the daemon(s) get SIGTERM,
    # ask their ranks to save and stop them
    signalled=""
    trap 'signalled=USR1; stop_daemons' USR1
    trap 'signalled=TERM; stop_daemons' TERM
    wait "$child"
    local code=$?
    # wait returns early (>128) when a trap ran; the daemon's own code comes after
    while kill -0 "$child" 2>/dev/null; do wait "$child"; code=$?; done
    trap - USR1 TERM
    return "$code"
}

stop_daemons() {
    if [ -n "$several" ]; then
        touch "$CODES_DIR/stop"  # each node's watcher passes it on to its daemon
    else
        kill -TERM "$child" 2>/dev/null
    fi
}

# The nodes whose daemon exited with the reschedule code in the last launch.
rescheduled_nodes() {
    if [ "${SLURM_NNODES:-1}" -gt 1 ]; then
        grep -lx "$RESCHEDULE_CODE" "$CODES_DIR"/code.* 2>/dev/null | xargs -r -n 1 basename | sed 's/^code\.//'
    elif [ "$1" -eq "$RESCHEDULE_CODE" ]; then
        echo "${SLURMD_NODENAME:-$(hostname -s)}"
    fi
}

# The launch's outcome for the job, from the worst of its nodes: an abort, else a
# reschedule, else another failure, else a stop by a signal (the nodes told to stop).
job_code() {
    local srun_code=$1 codes c
    [ "${SLURM_NNODES:-1}" -gt 1 ] && [ -n "${SLURM_JOB_ID:-}" ] || { echo "$srun_code"; return; }
    codes=$(cat "$CODES_DIR"/code.* 2>/dev/null)
    for c in $codes; do [ "$c" -eq "$ABORT_CODE" ] && { echo "$c"; return; }; done
    for c in $codes; do [ "$c" -eq "$RESCHEDULE_CODE" ] && { echo "$c"; return; }; done
    for c in $codes; do [ "$c" -ne 0 ] && [ "$c" -le 128 ] && { echo "$c"; return; }; done
    for c in $codes; do [ "$c" -ne 0 ] && { echo "$c"; return; }; done
    echo "$srun_code"  # every node said 0, or none could say (srun's code)
}

# Requeue this job. A running job's ExcNodeList cannot be changed ("Job is no longer
# pending execution"), so the recipe requeues first and then excludes the bad nodes while
# the job is pending. SLURM signals the batch shell as it requeues: that must not cut the
# update short.
requeue() {
    trap '' TERM
    scontrol requeue "$SLURM_JOB_ID" || return 1
    if [ -s "$BAD_NODES_FILE" ]; then
        local exclude
        exclude=$(sort -u "$BAD_NODES_FILE" | paste -sd, -)
        if scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$exclude"; then
            echo "auto-resume: requeued without node(s) $exclude" >&2
        else
            echo "auto-resume: requeued, but could not exclude node(s) $exclude" >&2
        fi
    else
        echo "auto-resume: requeued" >&2
    fi
}

while true; do
    if [ -e "$FAULT_TOL_FINISHED_FLAG_FILE" ]; then
        echo "auto-resume: training finished ($FAULT_TOL_FINISHED_FLAG_FILE exists)"
        exit 0
    fi
    launch "$@"
    code=$(job_code $?)
    if [ -e "$FAULT_TOL_FINISHED_FLAG_FILE" ] || [ "$code" -eq 0 ]; then
        echo "auto-resume: training finished"
        exit 0
    fi
    if [ "$code" -eq "$ABORT_CODE" ]; then
        echo "auto-resume: abort (exit $code): retrying cannot help; see reason.json" >&2
        exit "$code"
    fi
    if [ "$signalled" = USR1 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
        echo "auto-resume: the time limit is near (SIGUSR1): the ranks saved; requeueing" >&2
        requeue && exit 0
        exit "$code"
    fi
    if [ -n "$signalled" ]; then
        echo "auto-resume: stopped by SIG$signalled (exit $code); the job ends" >&2
        exit "$code"
    fi
    failures=$(( $(cat "$COUNT_FILE" 2>/dev/null || echo 0) + 1 ))
    echo "$failures" > "$COUNT_FILE"
    if [ -n "${SLURM_JOB_ID:-}" ]; then rescheduled_nodes "$code" >> "$BAD_NODES_FILE"; fi
    if [ "$failures" -ge "$MAX_FAILURES" ]; then
        echo "auto-resume: $failures failed attempt(s), the budget ($MAX_FAILURES) is spent" >&2
        exit "$code"
    fi
    echo "auto-resume: attempt failed (exit $code), $failures of $MAX_FAILURES; resuming" >&2
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        requeue && exit 0
        echo "auto-resume: scontrol requeue failed (was the job cancelled?)" >&2
        exit "$code"
    fi
done
