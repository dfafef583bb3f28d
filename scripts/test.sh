#!/usr/bin/env bash
# Runs the whole test suite (lint, types, tests) on a fresh machine.
# Needs python3.11; installs tox into .tools/ and everything else through tox,
# with torch pinned to the CPU build (constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .tools/bin/tox ]; then
    python3 -m venv .tools
    .tools/bin/python -m pip install -q "tox>=4.11"
fi
exec .tools/bin/tox "$@"
