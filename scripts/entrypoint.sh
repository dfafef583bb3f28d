#!/bin/sh
# Container entrypoint for ft-supervisor (Kubernetes, Kubeflow PyTorchJob, OSMO, docker run).
#
#   ENTRYPOINT ["/opt/ft-supervisor/scripts/entrypoint.sh"]
#   CMD ["train.py", "--lr", "3e-4"]        # the training script and its arguments
#
# The daemon is exec'd, so it is the container's PID 1: the process that
# `docker stop` / the kubelet signal, and the one whose exit code the scheduler
# reads. As PID 1 it reaps every orphan of the container (the kernel gives them
# to it), forwards SIGUSR2 and SIGWINCH to the ranks (--forward-signals), and
# handles SIGTERM/SIGINT/SIGQUIT (and SIGHUP without a config file) as a
# graceful stop: the ranks may save (--save-timeout), then are stopped
# (--shutdown-timeout). Keep the pod's terminationGracePeriodSeconds above
# save + shutdown + kill timeouts (60 + 30 + 10 by default), or the kubelet's
# SIGKILL cuts the stop short. Under an init (docker --init, tini) the daemon is
# that init's child and makes itself the subreaper of its ranks instead.
#
# Exit codes, the same as outside a container (docs/guides/kubernetes.md has the table):
#   0        success: training finished                      -> Job succeeded
#   2        abort: retrying cannot help (a user code error,  -> podFailurePolicy FailJob;
#            a crash loop without progress)                       Kubeflow ExitCode policy: permanent
#   200      reschedule: this node should leave the job        -> retried (Kubeflow: 128-255 retryable;
#            (a bad GPU, NCCL on a broken link)                    SLURM RequeueExit=200; OSMO exitActions)
#   128+N    stopped by signal N (143: SIGTERM, preemption)     -> retried
#   1        the daemon's own failure                          -> retried or investigated
# The podFailurePolicy that tells them apart, and a node guard that keeps a rescheduled pod
# off the node: scripts/schedulers/k8s-job.yaml (one node), k8s-jobset.yaml (several).
# The reason (root cause, rank, rule, evidence) is in reason.json beside the event log;
# --reason-file /dev/termination-log adds a copy of at most 4096 bytes for the pod's status.
set -eu

# Settings from the environment. torchrun's PET_* variables (PET_NNODES,
# PET_NPROC_PER_NODE, PET_NODE_RANK, PET_RDZV_ENDPOINT, PET_MAX_RESTARTS... which
# Kubeflow's training operator sets for elastic jobs) and nvidia-resiliency-ext's
# FT_* and FAULT_TOL_CFG_PATH are read by the daemon itself. Below, this image's
# own names become options, placed before the command line (CMD, or the
# arguments of `docker run IMAGE ...`): everything from the training script on
# is the script's, and an option repeated on the command line wins.
n=$#  # the command line's arguments, moved behind the options at the end
[ -n "${NPROC_PER_NODE:-}" ] && set -- "$@" "--nproc-per-node=$NPROC_PER_NODE"
[ -n "${MAX_RESTARTS:-}" ] && set -- "$@" "--max-restarts=$MAX_RESTARTS"
[ -n "${FT_CONFIG:-}" ] && set -- "$@" "--ft-cfg-path=$FT_CONFIG"
[ -n "${SAVE_TIMEOUT:-}" ] && set -- "$@" "--save-timeout=$SAVE_TIMEOUT"
# the event log, reason.json and the ranks' logs: mount a volume here to keep them
set -- "$@" "--log-dir=${FT_LOG_DIR:-/var/log/ft-supervisor}"
# A Kubeflow PyTorchJob without an elastic policy describes the job torchrun's
# static way, one pod per node: WORLD_SIZE nodes, this pod's RANK, and the
# master pod's address, whose port hosts the rendezvous store.
if [ -z "${PET_NNODES:-}" ] && [ -n "${WORLD_SIZE:-}" ] && [ -n "${RANK:-}" ] \
    && [ -n "${MASTER_ADDR:-}" ] && [ -n "${MASTER_PORT:-}" ]; then
    set -- "$@" "--nnodes=$WORLD_SIZE" "--node-rank=$RANK" \
        "--master-addr=$MASTER_ADDR" "--master-port=$MASTER_PORT"
fi

# rotate the command line's arguments behind the options (POSIX sh has no arrays)
i=0
while [ "$i" -lt "$n" ]; do
    arg=$1
    shift
    set -- "$@" "$arg"
    i=$((i + 1))
done
exec ft-supervisor run "$@"
