"""Wheels for the carry: their Requires-Dist against carry + image, unpacking into one
site directory (``pip install --target`` without pip), pruning sglang, and the
sglang-kernel subset (Python files + the sm90 ``common_ops`` library)."""

from __future__ import annotations

import email.parser
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement

from gpu_kit.pins import normalize

#: Marker environment of the lent machine (CPython 3.12.3, x86-64 Linux).
TARGET_ENV: dict[str, str] = {
    **default_environment(),
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "python_full_version": "3.12.3",
    "python_version": "3.12",
    "sys_platform": "linux",
    "extra": "",
}

#: What is dropped from the sglang wheel: Rust extensions loaded only for gRPC, the Rust
#: server and multimodal processors (``srt/mem_cache/rust_tree_core`` stays), the
#: diffusion package, and bytecode.
SGLANG_PRUNE: tuple[str, ...] = (
    "sglang/srt/rust_extensions/_server.*.so",
    "sglang/srt/rust_extensions/_bench.*.so",
    "sglang/srt/rust_extensions/_grpc.*.so",
    "sglang/srt/rust_extensions/_multimodal.*.so",
    "sglang/multimodal_gen/**",
)

#: sglang's requirements left behind on purpose, by reason (the CPU import check with the
#: image emulated shows none of them is imported at module level on the kit's path).
NOT_CARRIED: dict[str, str] = {
    **dict.fromkeys(
        [
            "flashinfer-python",
            "flash-attn-4",
            "sgl-deep-ep",
            "sgl-deep-gemm",
            "sgl-flash-mla",
            "humming-kernels",
            "nvidia-cutlass-dsl",
            "nvidia-mathdx",
            "nvshmem4py-cu13",
            "quack-kernels",
            "tilelang",
            "torch-memory-saver",
            "cuda-python",
        ],
        "GPU library of another backend or feature; imported lazily or under try",
    ),  # fmt: skip
    "sglang-kernel": "0.4.10 cannot load on torch 2.11; 0.4.5's sm90 library is carried "
    "(gpu/pack --sgl-kernel) or gpu/shims/sgl_kernel_fallback stands in",
    **dict.fromkeys(
        [
            "anthropic",
            "blobfile",
            "build",
            "datasets",
            "deepseek-recipe",
            "easydict",
            "interegular",
            "kernels",
            "llguidance",
            "mistral-common",
            "modelscope",
            "openai-harmony",
            "outlines",
            "py-spy",
            "smg-grpc-servicer",
            "tml-renderers",
            "torchcodec",
            "watchfiles",
            "zstandard",
            "av",
            "decord2",
        ],
        "imported lazily, by another feature or API (not on the kit's path)",
    ),  # fmt: skip
    "ipython": "gpu/shims/common/IPython stands in (sglang/utils.py imports IPython.display)",
    **dict.fromkeys(
        ["torch", "transformers", "sentencepiece", "torchaudio", "numba", "timm"],
        "the image's own version is used (torch 2.11.0, transformers 5.17.0, ...)",
    ),
}


@dataclass
class WheelInfo:
    """A wheel's name, version and runtime requirements on the lent machine."""

    path: Path
    name: str
    version: str
    requires: list[Requirement] = field(default_factory=list)


def read_wheel(path: Path) -> WheelInfo:
    """Name, version and the Requires-Dist lines whose markers hold on the lent machine."""
    with zipfile.ZipFile(path) as zf:
        meta_name = next(
            n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
        )
        meta = email.parser.Parser().parsestr(zf.read(meta_name).decode("utf-8", "replace"))
    reqs = []
    for line in meta.get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate(TARGET_ENV):
            reqs.append(req)
    return WheelInfo(path, normalize(meta["Name"]), meta["Version"], reqs)


def check_requirements(
    wheels: list[WheelInfo], image: dict[str, str | None]
) -> dict[str, list[dict[str, str]]]:
    """Per wheel, each requirement and how it is met: ``carried``, ``image`` (version
    known and matching), ``image-version-unknown``, ``version-mismatch``, ``not-carried``
    (a reason in :data:`NOT_CARRIED`) or ``MISSING``."""
    carried = {w.name: w.version for w in wheels}
    report: dict[str, list[dict[str, str]]] = {}
    for wheel in wheels:
        rows = []
        for req in wheel.requires:
            key = normalize(req.name)
            have, where = (carried[key], "carry") if key in carried else (image.get(key), "image")
            if key in carried or key in image:
                if have is None:
                    status = "image-version-unknown"
                elif not req.specifier or req.specifier.contains(have, prereleases=True):
                    status = "carried" if where == "carry" else "image"
                elif key in NOT_CARRIED:
                    status = "not-carried"
                else:
                    status = "version-mismatch"
            else:
                status = "not-carried" if key in NOT_CARRIED else "MISSING"
            row = {"requirement": str(req), "status": status, "have": f"{where} {have}"}
            if status == "not-carried":
                row["reason"] = NOT_CARRIED[key]
            rows.append(row)
        report[f"{wheel.name}=={wheel.version}"] = rows
    return report


def problems(report: dict[str, list[dict[str, str]]]) -> list[str]:
    """The rows that would break an install or an import: MISSING and version-mismatch."""
    return [
        f"{wheel}: {row['requirement']} -> {row['status']} ({row['have']})"
        for wheel, rows in report.items()
        for row in rows
        if row["status"] in ("MISSING", "version-mismatch")
    ]


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    p = PurePosixPath(name)
    return any(p.match(pat) or name.startswith(pat.rstrip("*")) for pat in patterns)


def unpack(wheel: Path, site: Path, prune: tuple[str, ...] = ()) -> tuple[int, list[str]]:
    """Unzip a wheel into ``site`` as ``pip install --target`` lays it out (``*.data/
    purelib`` and ``platlib`` at the top, scripts and headers dropped); members matching
    ``prune`` are skipped. Returns (bytes written, pruned member names)."""
    written, pruned = 0, []
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if info.is_dir() or "/__pycache__/" in name or name.endswith(".pyc"):
                continue
            if _matches(name, prune):
                pruned.append(name)
                continue
            parts = name.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            dest = site.joinpath(*parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                dest.chmod(mode | 0o200)
            written += info.file_size
    return written, pruned


def sgl_kernel_members(names: list[str]) -> list[str]:
    """The sglang-kernel wheel members carried: every file of ``sgl_kernel`` except the
    compiled libraries, plus ``sgl_kernel/sm90/common_ops*`` (Hopper), the small
    ``spatial_ops`` and the dist-info (the host reads the version)."""
    keep = []
    for name in names:
        if name.endswith("/") or "/__pycache__/" in name:
            continue
        top = name.split("/", 1)[0]
        if top.endswith(".dist-info"):
            keep.append(name)
        elif top == "sgl_kernel":
            if not name.endswith(".so") or name.startswith(
                ("sgl_kernel/sm90/common_ops", "sgl_kernel/spatial_ops")
            ):
                keep.append(name)
    return keep


def unpack_members(wheel: Path, site: Path, members: list[str]) -> int:
    """Unzip only ``members`` of a wheel into ``site``; returns bytes written."""
    written = 0
    with zipfile.ZipFile(wheel) as zf:
        for name in members:
            dest = site / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(name) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            written += zf.getinfo(name).file_size
    return written
