#!/usr/bin/env bash
# A multi-node job whose rendezvous has no single point of failure: one etcd member and
# one ft-supervisor daemon per host, torch's etcd-v2 rendezvous between them. Any one
# etcd member (the leader included) may die and the job goes on; see the README,
# "Several nodes", and tests/integration/test_etcd.py, which runs this on loopback.
#
#   HOSTS="10.0.0.1 10.0.0.2 10.0.0.3" ME=10.0.0.2 JOB=job42 \
#       bash scripts/schedulers/etcd-rendezvous.sh etcd          # on each of the three hosts
#   HOSTS="10.0.0.1 10.0.0.2 10.0.0.3" ME=10.0.0.2 JOB=job42 NNODES=4 \
#       bash scripts/schedulers/etcd-rendezvous.sh run train.py --lr 3e-4   # on every node
#
# Needs etcd 3.4 (Debian: etcd-server; it serves torch's v2 API with --enable-v2) and
# python-etcd beside ft-supervisor (pip install python-etcd).
set -euo pipefail

: "${HOSTS:?the etcd members' addresses, space-separated}"
: "${ME:?this host's address}"
JOB=${JOB:-job}
NNODES=${NNODES:-$(wc -w <<<"$HOSTS")}
NPROC=${NPROC:-8}
MAX_RESTARTS=${MAX_RESTARTS:-3}
CLIENT_PORT=${CLIENT_PORT:-2379}
PEER_PORT=${PEER_PORT:-2380}
FT_SUPERVISOR=${FT_SUPERVISOR:-ft-supervisor}

name_of() { echo "m${1//./-}"; }

case "${1:-}" in
etcd)
    cluster=""
    for h in $HOSTS; do cluster+="${cluster:+,}$(name_of "$h")=http://$h:$PEER_PORT"; done
    exec etcd --name "$(name_of "$ME")" --enable-v2 --data-dir "${DATA_DIR:-/var/lib/etcd-$JOB}" \
        --listen-client-urls "http://$ME:$CLIENT_PORT" --advertise-client-urls "http://$ME:$CLIENT_PORT" \
        --listen-peer-urls "http://$ME:$PEER_PORT" --initial-advertise-peer-urls "http://$ME:$PEER_PORT" \
        --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "$JOB"
    ;;
run)
    shift
    # torch's etcd client takes one endpoint: the member on this host when there is
    # one, so that losing another member (the leader, say) costs only its election
    endpoint=$ME:$CLIENT_PORT
    grep -qw -- "$ME" <<<"$HOSTS" || endpoint=${HOSTS%% *}:$CLIENT_PORT
    exec "$FT_SUPERVISOR" run --nnodes "$NNODES" --nproc-per-node "$NPROC" \
        --rdzv-backend etcd-v2 --rdzv-endpoint "$endpoint" --rdzv-id "$JOB" \
        --local-addr "$ME" --max-restarts "$MAX_RESTARTS" "$@"
    ;;
*)
    echo "usage: $0 etcd | run SCRIPT [ARGS...]" >&2
    exit 2
    ;;
esac
