"""Setting up the lent machine from the carry: unpack the archives, build the plugin from
the tree that travelled (background), choose ``sgl_kernel`` (carried 0.4.5 or the kit's
fallback), assemble each server's environment, and read the machine's facts."""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_kit.pins import GPU_DIR, REPO
from gpu_kit.servers import ServerSpec
from gpu_kit.warm import carry_stamp

SHIMS = GPU_DIR / "shims"
PROBE_SITE = GPU_DIR / "probe_site"

#: Host settings for every server on the lent machine (see docs/gpu.md).
GPU_ENV: dict[str, str] = {
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",  # carried 0.4.5 (or the fallback), pin 0.4.10
    "SGLANG_RUST_BUILD_MODE": "never",  # a pruned Rust extension must never start cargo
    # The carried radix tree's Rust core rejected the int64 KV indices of a CUDA tensor
    # ("insert value must be an int64 tensor, got Int8") under the image's torch 2.11
    # (sglang pins 2.14.1): every bf16 server died at its first finished request in the
    # second GPU run, and the CPU rehearsal on torch 2.11 reproduced it ("Rust TreeCore
    # panicked: ... UnknownKind(16)"): the core links libtorch, built against 2.14. The
    # host's own Python tree core instead.
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
    # /health without a generation (http_server.health_generate): readiness is "up and
    # serving"; the kit's own first request then tests prefill/decode/verify, timed apart.
    "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}


def run_text(cmd: list[str], timeout: float = 30.0, env: dict[str, str] | None = None) -> str:
    """A command's output, or the reason there is none (never raises)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return (p.stdout + p.stderr).strip()[-4000:]
    except (OSError, subprocess.SubprocessError) as exc:
        return f"({type(exc).__name__}: {exc})"


@dataclass
class Layout:
    """Where things go on the machine the run is on."""

    work: Path
    carry: Path
    site: Path = field(init=False)
    kernel_site: Path = field(init=False)
    plugin_site: Path = field(init=False)
    models: Path = field(init=False)
    logs: Path = field(init=False)
    cache: Path = field(init=False)
    jit_cache: Path = field(init=False)
    triton_cache: Path = field(init=False)
    pids: Path = field(init=False)

    def __post_init__(self) -> None:
        self.site = self.work / "site"
        self.kernel_site = self.work / "sgl_kernel_site"
        self.plugin_site = self.work / "plugin"
        self.models = self.work / "models"
        self.logs = self.work / "logs"
        self.cache = self.work / "cache"
        self.jit_cache = self.cache / "sglang-jit"
        self.triton_cache = self.cache / "triton"
        self.pids = self.work / "servers.pids"

    def cache_env(self) -> dict[str, str]:
        """Every compile cache a server fills, under ``cache/`` (kept on a warm machine,
        packed by ``--save-jit-cache``, unpacked from the carry's ``jit-cache.tar.xz``)."""
        return {
            "SGLANG_JIT_CACHE_DIR": str(self.jit_cache),  # sglang's tvm-ffi + nvcc kernels
            "TRITON_CACHE_DIR": str(self.triton_cache),
            # tvm-ffi's own builds (none expected: torch 2.11 has the DLPack exchange API)
            "TVM_FFI_CACHE_DIR": str(self.cache / "tvm-ffi"),
            "TORCHINDUCTOR_CACHE_DIR": str(self.cache / "inductor"),  # HYBRID's compiled helpers
        }


def extract_carry(layout: Layout, reuse_stamp: str | None = None) -> dict[str, Any]:
    """Unpack ``site.tar.xz``, ``sgl_kernel.tar.xz`` and a previous run's
    ``jit-cache.tar.xz`` (each where present); seconds and sizes per archive. On a warm
    machine (``reuse_stamp`` equal to the carry's stamp and the site there) the archives
    are not unpacked again, nor the JIT cache over a cache already filled."""
    layout.work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"stamp": carry_stamp(layout.carry)}
    reuse = reuse_stamp is not None and reuse_stamp == report["stamp"] and layout.site.is_dir()
    for archive, dest in (
        ("site.tar.xz", layout.work),
        ("sgl_kernel.tar.xz", layout.work),
        ("jit-cache.tar.xz", layout.cache),
    ):
        path = layout.carry / archive
        if not path.is_file():
            report[archive] = "absent"
            continue
        if (reuse and archive != "jit-cache.tar.xz") or (
            archive == "jit-cache.tar.xz" and layout.jit_cache.is_dir()
        ):
            report[archive] = "kept from the previous call (warm machine)"
            continue
        dest.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        subprocess.run(["tar", "-xJf", str(path), "-C", str(dest)], check=True)
        report[archive] = {"mib": round(path.stat().st_size / 2**20, 2),
                           "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip
    report["site_overrides"] = overlay_site(layout)
    manifest = layout.carry / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        report["manifest"] = {"made": m.get("made"), "wheels": [w["wheel"] for w in m["wheels"]],
                              "sgl_kernel": m.get("sgl_kernel")}  # fmt: skip
    return report


def overlay_site(layout: Layout) -> list[str]:
    """Copy ``gpu/shims/site_overrides/`` over the unpacked site (modules of the carried
    sglang that cannot run on the lent image, each replaced by a stand-in that says why)."""
    overrides = SHIMS / "site_overrides"
    if not layout.site.is_dir() or not overrides.is_dir():
        return []
    done = []
    for src in sorted(overrides.rglob("*.py")):
        rel = src.relative_to(overrides)
        dest = layout.site / rel
        if not dest.parent.is_dir():
            continue
        dest.unlink(missing_ok=True)  # a hard-linked tree keeps its original
        shutil.copyfile(src, dest)
        done.append(str(rel))
    return done


def start_plugin_build(layout: Layout, native: bool = True) -> subprocess.Popen:
    """``pip install`` the plugin from the travelling tree into ``plugin_site`` (in the
    background; g++ and pybind11 on the image build the native suffix core)."""
    shutil.rmtree(layout.plugin_site, ignore_errors=True)
    layout.logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if not native:
        env["SGLANG_SPEC_EXT_NO_NATIVE"] = "1"
    log = open(layout.logs / f"plugin-build{'' if native else '-python'}.log", "wb")  # noqa: SIM115
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
           "--no-build-isolation", "--no-compile", "--disable-pip-version-check",
           "--target", str(layout.plugin_site), str(REPO)]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


def finish_plugin_build(layout: Layout, proc: subprocess.Popen, timeout_s: float) -> dict:
    """Waits for the build; a failed native build is retried without the native core."""
    t0 = time.monotonic()
    report: dict[str, Any] = {}
    for native in (True, False):
        if not native:
            proc = start_plugin_build(layout, native=False)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = -9
        log = layout.logs / f"plugin-build{'' if native else '-python'}.log"
        report["native_attempt" if native else "python_attempt"] = {
            "exit": code, "log_tail": log.read_text(errors="replace")[-1500:]}  # fmt: skip
        if code == 0:
            break
    if code != 0:
        report["source_fallback"] = source_install(layout)
    libs = glob.glob(str(layout.plugin_site / "**" / "_native*.so"), recursive=True)
    report.update(ok=True, installed_by="pip" if code == 0 else "source tree + entry point",
                  native_core=bool(libs), seconds=round(time.monotonic() - t0, 1))  # fmt: skip
    return report


def source_install(layout: Layout) -> dict[str, Any]:
    """Last resort when pip cannot build the plugin: the source tree on PYTHONPATH (pure
    Python drafter) and a dist-info whose entry points are pyproject's, so the host's
    ``load_plugins`` finds it."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    shutil.rmtree(layout.plugin_site, ignore_errors=True)
    info = (
        layout.plugin_site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    )
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = []
    for group, eps in project.get("entry-points", {}).items():
        lines += [f"[{group}]", *(f"{k} = {v}" for k, v in eps.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines))
    (layout.plugin_site / "SOURCE_TREE").write_text(str(REPO))
    return {"entry_points": project.get("entry-points", {}), "source": str(REPO)}


def kernel_probe_code() -> str:
    """Python that imports sgl_kernel and checks its rmsnorm against torch on the GPU."""
    return (
        "import json, torch, sgl_kernel\n"
        "x = torch.randn(4, 256, device='cuda', dtype=torch.bfloat16)\n"
        "w = torch.rand(256, device='cuda', dtype=torch.bfloat16)\n"
        "ref = torch.nn.functional.rms_norm(x.float(), (256,), w.float(), 1e-6)\n"
        "out = sgl_kernel.rmsnorm(x, w, 1e-6).float()\n"
        "torch.cuda.synchronize()\n"
        "err = ((out - ref).norm() / ref.norm()).item()\n"
        "print(json.dumps({'version': sgl_kernel.__version__, 'file': sgl_kernel.__file__,"
        " 'fallback': bool(getattr(sgl_kernel, 'GPU_KIT_FALLBACK', False)),"
        " 'rmsnorm_rel_err': err}))\n"
    )


def pythonpath(
    layout: Layout, spec: ServerSpec | None, kernel: str, dry: bool, rehearse: bool = False
) -> list[str]:
    """PYTHONPATH of a server: probe site, carried site (lent machine; the CPU rehearsal
    too), sgl_kernel (``carried`` or ``fallback``; not on CPU, where the plugin's
    placeholders stand in), the plugin (where the spec wants it), common shims last (a
    real package wins)."""
    path = [str(PROBE_SITE)]
    if not dry or rehearse:
        path.append(str(layout.site))
    if not dry:
        path.append(
            str(layout.kernel_site) if kernel == "carried" else str(SHIMS / "sgl_kernel_fallback")
        )
        if spec is None or spec.plugin:
            path.append(str(layout.plugin_site))
            if (layout.plugin_site / "SOURCE_TREE").is_file():
                path.append(str(REPO))
    path.append(str(SHIMS / "common"))
    return path


def machine_facts(env: dict[str, str] | None = None) -> dict[str, Any]:
    """Device, driver, toolchain, and the versions a server sees with ``env``."""
    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "glibc": "-".join(platform.libc_ver()),
        "cpus": os.cpu_count(),
        "nvidia_smi": run_text(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,memory.used,"
                "clocks.sm,clocks.max.sm,power.limit,compute_cap",
                "--format=csv",
            ]
        ),  # fmt: skip
        "nvcc": run_text(["nvcc", "--version"]).splitlines()[-2:],
        "gxx": run_text(["g++", "--version"]).splitlines()[:1],
    }
    code = (
        "import json, importlib.metadata as md\n"
        "out = {}\n"
        "for n in ('torch','triton','transformers','tokenizers','numpy','pybind11',"
        "'setuptools','anyio','httpx','huggingface-hub','torchvision','requests'):\n"
        "    try: out[n] = md.version(n)\n"
        "    except Exception as e: out[n] = None\n"
        "import torch\n"
        "out['cuda_available'] = torch.cuda.is_available()\n"
        "out['torch_cuda'] = torch.version.cuda\n"
        "if torch.cuda.is_available():\n"
        "    p = torch.cuda.get_device_properties(0)\n"
        "    out['device'] = {'name': p.name, 'cc': f'{p.major}.{p.minor}',"
        " 'sms': p.multi_processor_count, 'memory_gib': round(p.total_memory / 2**30, 1)}\n"
        "print(json.dumps(out))\n"
    )
    raw = run_text([sys.executable, "-c", code], timeout=120, env=env)
    try:
        facts["versions"] = json.loads(raw.splitlines()[-1])
    except (ValueError, IndexError):
        facts["versions"] = raw
    return facts
