#!/usr/bin/env bash
# The whole test suite on a CPU-only machine: builds the environment (idempotent)
# and runs unit, host-integration and end-to-end tests. `.ci/run` calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 --durations=40 "$@" tests
