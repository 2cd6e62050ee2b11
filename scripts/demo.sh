#!/usr/bin/env bash
# README demo: installs everything (idempotent), then serves the bundled small model
# (SmolLM2-135M-Instruct) on CPU with and without SUFFIX and prints accept length,
# tokens/s and whether greedy outputs are identical. Extra args go to scripts/demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/sglang-spec-ext doctor
exec .venv/bin/python scripts/demo.py "$@"
