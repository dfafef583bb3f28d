#!/usr/bin/env bash
# Runs the whole test suite (lint, types, tests, the docs site) on a fresh machine.
# Needs python3.11; installs tox into .tools/ and everything else through tox,
# with torch pinned to the CPU build (constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
# System packages some tests need, from Debian's archive on a clean CI machine (root,
# apt-get): one bounded update and install for all of them; a test whose tool cannot be had
# is skipped, saying why.
#   chromium    the run report's screenshot test (headless)
#   etcd-server the etcd-v2 rendezvous test (a three-member cluster; 3.4 serves v2 with --enable-v2)
#   systemd     tests/component/test_systemd_unit.py: `systemd-analyze verify` of the unit (4.7 MB)
#   slurm-wlm   tests/integration/test_slurm.py: a real single-host SLURM (munged, slurmctld,
#               two slurmd; about 50 s of apt here)
wanted=()
if [ -z "${CHROMIUM:-}" ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    wanted+=(chromium)
fi
command -v etcd >/dev/null || wanted+=(etcd-server)
command -v systemd-analyze >/dev/null || wanted+=(systemd)
{ command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ]; } || wanted+=(slurm-wlm)
if [ ${#wanted[@]} -gt 0 ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing ${wanted[*]} for the tests that need them" >&2
    if timeout 300 apt-get update -qq >/dev/null 2>&1; then
        for package in "${wanted[@]}"; do  # one at a time: one that fails costs only its tests
            lean=()  # systemd's recommends are a desktop's worth; chromium's fonts are wanted
            [ "$package" = systemd ] && lean=(--no-install-recommends)
            DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "${lean[@]}" "$package" \
                >/dev/null 2>&1 || echo "could not install $package: the tests that need it will be skipped" >&2
        done
    else
        echo "apt-get update failed: the tests that need ${wanted[*]} will be skipped" >&2
    fi
fi
if [ ! -x .tools/bin/tox ]; then
    python3 -m venv .tools
    .tools/bin/python -m pip install -q "tox>=4.11"
fi
exec .tools/bin/tox "$@"
