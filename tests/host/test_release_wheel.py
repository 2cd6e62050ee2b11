"""The release build: ``scripts/build_release.sh`` makes an sdist and a manylinux wheel that
holds the native suffix-tree core and every package file git tracks, and that wheel installs
into a FRESH virtual environment with no compiler on ``PATH`` and no index, where
``sglang-spec-ext doctor`` passes (native core included) and ``sglang-spec-ext serve-cpu
--print-command`` prints a launch command whose environment runs the wheel's CPU site.

The host (sglang, torch, ...) is not reinstalled: a ``.pth`` file in the fresh venv appends
this interpreter's site-packages after the venv's own, as a plain path (the dev venv's own
``.pth`` files, its editable install of this package among them, are not run), and the test
checks that ``sglang_spec_ext`` and its distribution resolve to the fresh venv.

Nothing here names a module of the package: files are compared with ``git ls-files`` and the
product is driven through its console script. One build per module, shared by the tests
(2 cores: the build 13-14 s, the module about 30 s alone; about 65 s in a fresh clone, whose
first run installs the build venv from PyPI, or beside another test process). docs/release.md
describes the build and this test.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_release.sh"
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "clang++")
NATIVE = "_native*.so"

pytestmark = pytest.mark.release


def _run(cmd, *, env=None, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def _out(res: subprocess.CompletedProcess) -> str:
    return f"exit {res.returncode}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr}"


def _without_our_settings(env) -> dict[str, str]:
    """``env`` without run-time settings of the package or a Python path of this checkout."""
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE")
    return {k: v for k, v in env.items() if not k.startswith("SGLANG_SPEC_EXT_") and k not in drop}


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> dict:
    if os.environ.get("SGLANG_SPEC_EXT_NO_NATIVE", "") in ("1", "true", "yes"):
        pytest.skip("native core not built on purpose (SGLANG_SPEC_EXT_NO_NATIVE): no release")
    dist = tmp_path_factory.mktemp("dist")
    # The wheel is for this interpreter's Python; the build venv stays in the checkout's
    # ignored build/ (created from PyPI on the first run, reused after).
    env = _without_our_settings(os.environ) | {"PYTHON": sys.executable, "SPEC_EXT_DIST": str(dist)}
    res = _run(["bash", SCRIPT], env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, _out(res)
    wheels = sorted(dist.glob("sglang_spec_ext-*.whl"))
    sdists = sorted(dist.glob("sglang_spec_ext-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, (sorted(os.listdir(dist)), _out(res))
    return {"wheel": wheels[0], "sdist": sdists[0], "log": res.stdout + res.stderr}


def test_the_wheel_is_manylinux_with_the_native_core_and_every_tracked_package_file(release):
    wheel = release["wheel"]
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        meta = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/WHEEL"))
    tags = re.findall(r"^Tag: (\S+)$", meta, re.M)
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert tags and all(re.fullmatch(rf"{py}-{py}-manylinux\w+", t) for t in tags), tags
    assert f"-{py}-{py}-manylinux" in wheel.name
    native = [n for n in names if fnmatch.fnmatch(Path(n).name, NATIVE)]
    assert native and all(n.startswith("sglang_spec_ext/") for n in native), names
    tracked = _run(["git", "ls-files", "sglang_spec_ext"], cwd=ROOT).stdout.split()
    assert len(tracked) > 10 and any(n.endswith("sitecustomize.py") for n in tracked)
    missing = sorted(set(tracked) - set(names))
    assert not missing, f"tracked package files missing from {wheel.name}: {missing}"
    # nothing but the package, its metadata and auditwheel's grafted libraries (no tests/...)
    ours = ("sglang_spec_ext/", "sglang_spec_ext-", "sglang_spec_ext.libs/")
    strays = [n for n in names if not n.startswith(ours)]
    assert not strays, strays
    assert "native core: sglang_spec_ext/" in release["log"]


def _fresh_venv(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A new venv and a bare environment for it: PATH is the venv's bin and an empty tools
    folder, compilers point nowhere, pip has no index and any network goes to a dead proxy."""
    venv = tmp_path / "venv"
    res = _run([sys.executable, "-m", "venv", venv], env=_without_our_settings(os.environ))
    assert res.returncode == 0, _out(res)
    for d in ("tools", "home", "tmp", "cwd"):
        (tmp_path / d).mkdir()
    dead = "http://127.0.0.1:9"
    env = {
        "PATH": os.pathsep.join([str(venv / "bin"), str(tmp_path / "tools")]),
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "tmp"),
        "LANG": "C.UTF-8",
        "CC": "/nonexistent/cc",
        "CXX": "/nonexistent/c++",
        "OMP_NUM_THREADS": "1",
        "PIP_NO_INDEX": "1",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "HF_HUB_OFFLINE": "1",
        **{k: dead for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")},
    }
    return venv, env


PROBE = """
import importlib.metadata as md, json, shutil, sys, sysconfig
import sglang_spec_ext
from packaging.requirements import Requirement
dist = md.distribution("sglang-spec-ext")
unmet = []
for text in dist.requires or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        version = None
    if version is None or not req.specifier.contains(version, prereleases=True):
        unmet.append(f"{text} (found {version})")
print(json.dumps({
    "site": sysconfig.get_paths()["purelib"],
    "package": sglang_spec_ext.__file__,
    "dist": str(dist.locate_file("")),
    "unmet": unmet,
    "compilers": {c: shutil.which(c) for c in sys.argv[1:]},
}))
"""


def test_the_wheel_installs_and_runs_without_a_compiler_or_an_index(release, tmp_path):
    venv, env = _fresh_venv(tmp_path)
    py, cli, cwd = venv / "bin" / "python", venv / "bin" / "sglang-spec-ext", tmp_path / "cwd"
    res = _run(
        [py, "-m", "pip", "install", "--no-index", "--no-deps", "--only-binary=:all:",
         release["wheel"]],
        env=env, cwd=cwd,
    )  # fmt: skip
    assert res.returncode == 0, _out(res)
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     env=env).stdout.strip())  # fmt: skip
    # The host packages: this interpreter's site-packages, after the venv's own.
    host = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    assert str(site) not in host
    (site / "zz_spec_ext_host.pth").write_text("".join(f"{p}\n" for p in host))

    res = _run([py, "-c", PROBE, *COMPILERS], env=env, cwd=cwd)
    assert res.returncode == 0, _out(res)
    probe = json.loads(res.stdout.strip().splitlines()[-1])
    assert probe["compilers"] == dict.fromkeys(COMPILERS), probe["compilers"]
    assert Path(probe["package"]).is_relative_to(site), probe  # not the dev checkout
    assert Path(probe["dist"]) == site, probe  # the wheel's metadata, not the dev install's
    assert probe["unmet"] == [], probe["unmet"]

    report = tmp_path / "doctor.json"
    res = _run([cli, "doctor", "--json", report], env=env, cwd=cwd)
    assert res.returncode == 0, _out(res)
    assert "doctor: all checks passed" in res.stdout, _out(res)
    assert f"({py})" in res.stdout.splitlines()[0], _out(res)
    data = json.loads(report.read_text())
    assert data["ok"] is True and data["native_suffix_core"] is True, data
    assert data["registration"]["algorithms"] == {"SUFFIX": True, "HYBRID": True}, data

    model = tmp_path / "model"
    res = _run(
        [cli, "serve-cpu", "--print-command", "--", "--model-path", model,
         "--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", "8"],
        env=env, cwd=cwd,
    )  # fmt: skip
    assert res.returncode == 0, _out(res)
    lines = res.stdout.splitlines()
    launch = [shlex.split(line) for line in lines if " -m sglang.launch_server " in line]
    assert len(launch) == 1, _out(res)
    argv = launch[0]
    assert argv[:3] == [str(py), "-m", "sglang.launch_server"], argv
    assert argv[argv.index("--model-path") + 1] == str(model) and "--device" in argv, argv
    printed = dict(line.split("=", 1) for line in lines if re.match(r"^[A-Z_]+=", line))
    assert printed.get("SGLANG_USE_CPU_ENGINE") == "1", _out(res)
    entries = printed["PYTHONPATH"].split(os.pathsep)
    assert all(Path(p).is_relative_to(site) for p in entries), entries  # the wheel's files
    assert (Path(entries[0]) / "sitecustomize.py").is_file(), entries
    # The printed environment runs the wheel's CPU site: the host's GPU-only import works.
    res = _run(
        [py, "-c", "import sitecustomize, sgl_kernel; print(sitecustomize.__file__)"],
        env=env | printed, cwd=cwd,
    )  # fmt: skip
    assert res.returncode == 0, _out(res)
    assert Path(res.stdout.strip()).is_relative_to(site), _out(res)

    # The checks above can fail: without the native core doctor does.
    removed = list(site.glob(f"sglang_spec_ext/**/{NATIVE}"))
    assert removed
    for so in removed:
        so.unlink()
    res = _run([cli, "doctor", "--json", report], env=env, cwd=cwd)
    assert res.returncode != 0, _out(res)
    assert json.loads(report.read_text())["native_suffix_core"] is False, _out(res)
