#!/usr/bin/env bash
# The whole test suite on a CPU-only machine: builds the environment (idempotent)
# and runs unit, host-integration and end-to-end tests. `.ci/run` calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# Test files run in SPEC_EXT_TEST_WORKERS parallel pytest processes (default 2; 0 runs them
# in this process), one whole file per process (--dist loadfile: a module's servers and
# fixtures stay in one process), costliest e2e modules first (tests/conftest.py). Most of
# the end-to-end time is server start-up, mostly CPU-bound host imports in three processes
# per server; two processes fill the cores' idle gaps (measured on 2 cores: 61 -> 50
# minutes); four were no faster and took 22 of 24 GiB of memory. --no-loadscope-reorder:
# xdist otherwise hands out files by their number of tests, most first, which put the
# one-test e2e modules (SmolLM2, the soak: minutes each) at the end of the run.
exec .venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 --durations=40 \
  -n "${SPEC_EXT_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@" tests
