#!/usr/bin/env bash
# Runs the whole test suite (lint, types, tests) on a fresh machine.
# Needs python3.11; installs tox into .tools/ and everything else through tox,
# with torch pinned to the CPU build (constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
# the run report's screenshot test needs a headless Chromium: on a clean Debian CI
# machine (root, apt-get) install it, bounded; without it that one test is skipped
if [ -z "${CHROMIUM:-}" ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null \
    && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing chromium for the run report's screenshot test" >&2
    { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq chromium; } \
        >/dev/null 2>&1 || echo "could not install chromium: the screenshot test will be skipped" >&2
fi
# the etcd-v2 rendezvous test runs a three-member etcd cluster (Debian's etcd-server 3.4
# serves the v2 API with --enable-v2); without it that test is skipped
if ! command -v etcd >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing etcd-server for the etcd-v2 rendezvous test" >&2
    { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq etcd-server; } \
        >/dev/null 2>&1 || echo "could not install etcd-server: the etcd test will be skipped" >&2
fi
# the SLURM recipe's test starts a real single-host SLURM (Debian's slurm-wlm: munged,
# slurmctld, slurmd; about 50 s of apt here); without it that test is skipped
if ! command -v slurmctld >/dev/null && ! [ -x /usr/sbin/slurmctld ] && command -v apt-get >/dev/null \
    && [ "$(id -u)" = 0 ]; then
    echo "installing slurm-wlm for the SLURM recipe's test" >&2
    { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq slurm-wlm; } \
        >/dev/null 2>&1 || echo "could not install slurm-wlm: the SLURM test will be skipped" >&2
fi
if [ ! -x .tools/bin/tox ]; then
    python3 -m venv .tools
    .tools/bin/python -m pip install -q "tox>=4.11"
fi
exec .tools/bin/tox "$@"
