"""Check a built carry without the lent machine (``gpu/pack --verify``).

The carried extensions are cp312 and cannot be imported by another Python, so this checks
what can be checked anywhere: the archives unpack; every module of the host's CUDA path
(:data:`gpu_kit.importcheck.CUDA_PATH_MODULES`) is in the pruned sglang; the pruned Rust
extensions and ``multimodal_gen`` are gone while ``rust_tree_core`` stays; every compiled
extension is built for CPython 3.12 (or the stable ABI); and, given a reference sglang
install (``--compare-with``, e.g. the CPU venv's, which the CPU import check used), which
of the host's Python files differ from it.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from gpu_kit.importcheck import CUDA_PATH_MODULES


def extract(archive: Path, dest: Path) -> Path:
    """``tar -xJf archive -C dest``; returns the top folder it held."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-xJf", str(archive), "-C", str(dest)], check=True)
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise RuntimeError(f"{archive}: expected one top folder, got {tops}")
    return tops[0]


def module_file(site: Path, module: str) -> Path | None:
    base = site.joinpath(*module.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compare_python_files(carried: Path, reference: Path) -> dict[str, Any]:
    """The sglang ``.py`` files that differ between the carry and a reference install."""
    ours = {p.relative_to(carried): p for p in carried.rglob("*.py")}
    theirs = {p.relative_to(reference): p for p in reference.rglob("*.py")}
    common = sorted(set(ours) & set(theirs))
    differ = [str(r) for r in common if _digest(ours[r]) != _digest(theirs[r])]
    return {
        "common_files": len(common),
        "differ": differ[:20],
        "differ_count": len(differ),
        "only_in_carry": sorted(str(r) for r in set(ours) - set(theirs))[:20],
        "only_in_reference": len(set(theirs) - set(ours)),
    }


def verify(carry: Path, compare_with: Path | None = None) -> dict[str, Any]:
    """The checks above on ``carry`` (a folder made by ``gpu/pack``)."""
    report: dict[str, Any] = {"carry": str(carry)}
    with tempfile.TemporaryDirectory(prefix="gpu-kit-verify-") as tmp:
        site = extract(carry / "site.tar.xz", Path(tmp) / "a")
        sgl = site / "sglang"
        report["cuda_path_modules_missing"] = [
            m for m in CUDA_PATH_MODULES if module_file(site, m) is None
        ]
        sos = sorted(str(p.relative_to(site)) for p in site.rglob("*.so"))
        report["extensions"] = len(sos)
        # Python extension modules carry an ABI tag; plain shared libraries (libsndfile,
        # libtvm_ffi) do not and are loaded by their packages.
        report["extensions_not_cp312"] = [
            s for s in sos if re.search(r"cpython-3\d+", s) and "cpython-312" not in s
        ]
        rust = sgl / "srt" / "rust_extensions"
        report["rust_extensions_left"] = sorted(p.name for p in rust.glob("*.so"))
        report["rust_tree_core"] = sorted(
            p.name for p in (sgl / "srt/mem_cache/rust_tree_core").glob("*.so")
        )
        report["multimodal_gen_present"] = (sgl / "multimodal_gen").exists()
        report["dist_infos"] = sorted(p.name for p in site.glob("*.dist-info"))
        if compare_with is not None:
            report["python_vs_reference"] = compare_python_files(sgl, compare_with)
        kernel = carry / "sgl_kernel.tar.xz"
        if kernel.is_file():
            ksite = extract(kernel, Path(tmp) / "k")
            report["sgl_kernel"] = {
                "sm90_common_ops": sorted(
                    p.name for p in (ksite / "sgl_kernel/sm90").glob("common_ops*")
                ),
                "libraries": sorted(str(p.relative_to(ksite)) for p in ksite.rglob("*.so")),
                "dist_info": sorted(p.name for p in ksite.glob("*.dist-info")),
            }
    report["ok"] = not (
        report["cuda_path_modules_missing"]
        or report["extensions_not_cp312"]
        or report["rust_extensions_left"]
        or report["multimodal_gen_present"]
        or not report["rust_tree_core"]
    )
    return report


def main(carry: Path, compare_with: Path | None) -> int:
    report = verify(carry, compare_with)
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1
