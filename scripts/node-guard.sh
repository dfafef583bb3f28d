#!/bin/sh
# Kubernetes init container: keep a job's pods off a node whose health ledger says it is
# quarantined (docs/guides/kubernetes.md, "Keeping a pod off the bad node").
#
#   initContainers:
#   - name: node-guard
#     image: <your training image: ft-supervisor, this script and kubectl>
#     command: ["/opt/ft-supervisor/scripts/node-guard.sh",
#               "--node-state-dir", "/var/lib/ft-supervisor", "--node-quarantine", "1/24h"]
#     env: [{name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}]
#
# The ledger is ft-supervisor's (`ft-supervisor node`): every hardware-looking failure on a
# node (Xid, ECC, NVLink, a rank that outlived SIGKILL) leaves a mark in it. On a hostPath
# volume it outlives the pod, so the next pod the scheduler puts on that node reads it here.
# The options are those of `ft-supervisor node` and must match the trainer's.
#
#   ledger below the threshold  -> exit 0: the trainer starts
#   quarantined                 -> label the node "$QUARANTINE_LABEL=true" (kubectl, with the
#                                  pod's service account), then exit $RESCHEDULE_CODE (200):
#                                  the pod fails before any GPU work, the Job recreates it,
#                                  and the pod template's nodeAffinity keeps it off this node
#   the ledger cannot be judged -> exit 0: a guard that fails must not stop a healthy node
#
# After a repair: `ft-supervisor node --clear` on the node (the same --node-state-dir), and
# `kubectl label node NODE ft-supervisor.io/quarantined-`.
set -u

: "${NODE_NAME:?NODE_NAME: set it from the downward API (fieldRef spec.nodeName)}"
QUARANTINE_LABEL=${QUARANTINE_LABEL:-ft-supervisor.io/quarantined}
RESCHEDULE_CODE=${RESCHEDULE_CODE:-200}
FT_SUPERVISOR=${FT_SUPERVISOR:-ft-supervisor}
KUBECTL=${KUBECTL:-kubectl}

"$FT_SUPERVISOR" node "$@"
rc=$?
case $rc in
    0) exit 0 ;;
    3) ;;  # ft-supervisor node: a --node-quarantine threshold holds
    *)
        echo "node-guard: 'ft-supervisor node' exited $rc: the ledger cannot be judged, starting anyway" >&2
        exit 0
        ;;
esac

echo "node-guard: node $NODE_NAME is quarantined: labelling it $QUARANTINE_LABEL=true" >&2
if ! "$KUBECTL" label node "$NODE_NAME" "$QUARANTINE_LABEL=true" --overwrite; then
    # without the label the Job may place its next pod here again; this guard then fails
    # that pod too, each time counted against the Job's backoffLimit
    echo "node-guard: could not label $NODE_NAME (is the service account allowed to patch nodes?)" >&2
fi
exit "$RESCHEDULE_CODE"
