#!/usr/bin/env bash
# Installs ArcticInference's suffix-decoding cache (PyPI `arctic-inference`, built
# from its sdist on a CPU-only machine) into the ACTIVE virtual environment, so
# benchmarks/drafter_speed.py can time it side by side with our drafter.
#
# What the sdist needs and why this works without CUDA:
#   * setup.py builds `arctic_inference.suffix_decoding._C` (C++20, nanobind) with
#     CMake; the CUDA custom ops are built only when ARCTIC_INFERENCE_PRECOMPILED_OPS
#     is set, so we make sure it is not.
#   * setup.py imports torch (only for its cmake prefix path): the venv's CPU torch
#     does, so we build with --no-build-isolation instead of letting pip fetch the
#     CUDA torch its build-system table asks for.
#   * its build_py step generates gRPC stubs with grpc_tools; when grpc_tools is
#     absent it prints an error and carries on (the embedding server is unused here).
#   * CMake needs the venv's interpreter (Python_EXECUTABLE) with headers, and
#     `python -m nanobind --cmake_dir`: we install the pinned nanobind (2.9.2).
# Dependencies of arctic-inference itself (vllm, ...) are NOT installed (--no-deps);
# the suffix cache needs only numpy.
#
# Env: ARCTIC_VERSION (default 0.3.0), ARCTIC_WORKDIR (default a temp dir).
set -euo pipefail

ARCTIC_VERSION=${ARCTIC_VERSION:-0.3.0}
NANOBIND_VERSION=${NANOBIND_VERSION:-2.9.2}

if [ -z "${VIRTUAL_ENV:-}" ]; then
  echo "[arctic] activate the target virtual environment first" >&2
  exit 2
fi
PY="$VIRTUAL_ENV/bin/python"

if "$PY" -c "from arctic_inference.suffix_decoding import SuffixDecodingCache" 2>/dev/null \
   && [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("arctic-inference"))')" = "$ARCTIC_VERSION" ]; then
  echo "[arctic] arctic-inference $ARCTIC_VERSION already importable; nothing to do"
  exit 0
fi

command -v cmake >/dev/null || { echo "[arctic] cmake not found (apt-get install cmake)" >&2; exit 3; }
command -v c++ >/dev/null || { echo "[arctic] no C++ compiler (apt-get install g++)" >&2; exit 3; }
"$PY" -c "import torch" 2>/dev/null || { echo "[arctic] torch must be importable in the venv (setup.py imports it)" >&2; exit 3; }

WORK=${ARCTIC_WORKDIR:-$(mktemp -d)}
mkdir -p "$WORK"
echo "[arctic] work dir $WORK"

pipq() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }

echo "[arctic] build tools: nanobind==$NANOBIND_VERSION"
pipq "nanobind==$NANOBIND_VERSION"

echo "[arctic] fetching the sdist arctic-inference==$ARCTIC_VERSION"
"$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
  --no-build-isolation -d "$WORK" "arctic-inference==$ARCTIC_VERSION"
SDIST="$WORK/arctic_inference-$ARCTIC_VERSION.tar.gz"
[ -f "$SDIST" ] || { echo "[arctic] sdist not found at $SDIST" >&2; exit 4; }

echo "[arctic] building the suffix tree extension (CPU only; a minute or two)"
unset ARCTIC_INFERENCE_PRECOMPILED_OPS
export CMAKE_ARGS="${CMAKE_ARGS:-} -DPython_EXECUTABLE=$PY"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
pipq --no-deps --no-build-isolation "$SDIST"

"$PY" - <<'PY'
import importlib.metadata as md

from arctic_inference.suffix_decoding import SuffixDecodingCache

cache = SuffixDecodingCache(max_tree_depth=8, max_cached_requests=4)
cache.start_request("r", [1, 2, 3, 1, 2])
draft = cache.speculate("r", [1, 2, 3, 1, 2], max_spec_tokens=4)
print(f"[arctic] arctic-inference {md.version('arctic-inference')} OK; "
      f"SuffixDecodingCache draft on a toy stream: {list(draft.token_ids)}")
PY
