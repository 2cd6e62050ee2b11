"""``gpu/rehearse``: the kit rehearsed on a CPU machine with the lent image's versions,
before any GPU (docs/gpu.md, "The rehearsal on the image's versions").

Every failure of the first GPU runs was a version gap (torch 2.11 against sglang's 2.14
pins, transformers 5.17, triton 3.6, a kernel library built for another torch). This
builds a venv OUTSIDE the repository with the image's versions (Python 3.12, torch
2.11.0, triton 3.6.0, transformers 5.17.0, ... from ``gpu/image-packages.txt``), builds
the carry as ``gpu/pack`` does, copies the tree the device tool would send, then runs in
that venv: the import check of the host's CUDA path (CUDA faked, every distribution that
is neither on the image nor carried hidden), the carried ``sgl_kernel`` library's load
against torch 2.11, and ``gpu/run --rehearse`` (the install as on the GPU: unpack,
overrides, plugin build with pip; then every stage on SGLang's CPU engine, importing the
carried sglang). Steps (default: all, in this order)::

    gpu/rehearse --dir /tmp/gpu-rehearsal --venv /tmp/gpu-rehearsal-venv [--steps ...]

On PyPI, torch 2.11.0 for Linux x86-64 is the CUDA build: the venv step downloads about
3 GB of nvidia-* wheels (on demand only, never in CI).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from gpu_kit.pins import CARRY_PINS, GPU_DIR, IMAGE_PACKAGES, REPO, load_image

#: Image packages installed in the rehearsal venv: the ones the host's path imports and
#: the plugin build uses. Versions from gpu/image-packages.txt where it names one.
HOST_PATH_IMAGE = (
    "torch", "triton", "torchvision", "torchaudio", "transformers", "tokenizers", "numpy",
    "safetensors", "sentencepiece", "tiktoken", "huggingface-hub", "anyio", "httpx",
    "requests", "pybind11", "setuptools", "wheel", "psutil", "pyyaml", "pillow", "aiohttp",
    "uvloop", "prometheus-client", "msgpack", "einops", "tqdm", "regex", "packaging",
    "filelock", "jinja2", "scipy", "numba", "cuda-bindings", "cuda-pathfinder", "ninja",
    "nvidia-ml-py", "pytest",
)  # fmt: skip
STEPS = ("venv", "pack", "tree", "imports", "kernel", "run")


def find_python312() -> str | None:
    """A CPython 3.12 here (the image has 3.12.3), or None."""
    found = shutil.which("python3.12")
    if found and subprocess.run([found, "-V"], capture_output=True).returncode == 0:
        return found
    cands = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))
    return cands[-1] if cands else None


def image_requirements() -> list[str]:
    image = load_image(IMAGE_PACKAGES)
    out = []
    for name in HOST_PATH_IMAGE:
        version = image.get(name)
        out.append(f"{name}=={version}" if version else name)
    return out


def sh(cmd: list[str], log: Path, env: dict[str, str] | None = None, timeout: float = 3600) -> int:
    """Runs ``cmd``, its output appended to ``log``; prints the command and its tail."""
    shown = " ".join(c if len(c) < 120 else c.splitlines()[0][:60] + " ..." for c in cmd)
    print(f"$ {shown}", flush=True)
    t0 = time.monotonic()
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        start = f.tell()
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    with open(log, errors="replace") as f:
        f.seek(start)
        lines = f.read().splitlines()
    print("\n".join(f"  {ln}" for ln in lines[-12:]))
    print(f"  -> exit {p.returncode} in {time.monotonic() - t0:.0f} s", flush=True)
    return p.returncode


def copy_tree(dest: Path) -> int:
    """The files the device tool sends: tracked, and untracked but not ignored."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
                         capture_output=True, check=True).stdout  # fmt: skip
    shutil.rmtree(dest, ignore_errors=True)
    n = 0
    for rel in filter(None, out.decode().split("\0")):
        src = REPO / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
            n += 1
    return n


#: A CUDA driver stand-in: the carried sm90 library links ``libcuda.so.1`` (no driver on
#: a CPU machine) for this one function; every call answers CUDA_ERROR_NO_DEVICE.
CUDA_STUB_C = "int cuPointerGetAttribute(void *d, int a, unsigned long long p) { return 100; }\n"


def torch_symbols_missing(library: Path, torch_lib: Path) -> list[str]:
    """The library's undefined torch/c10/at symbols that the torch libraries do not
    define (``nm -D``): what made sglang-kernel 0.4.10 unusable on torch 2.11."""

    def names(path: Path, flag: str) -> set[str]:
        out = subprocess.run(["nm", "-D", flag, str(path)], capture_output=True, text=True)
        return {ln.split()[-1].split("@")[0] for ln in out.stdout.splitlines() if ln.strip()}

    wanted = {n for n in names(library, "--undefined-only")
              if n.startswith(("_ZN3c10", "_ZNK3c10", "_ZN2at", "_ZNK2at", "_ZN5torch", "_ZNK5torch"))}  # fmt: skip
    have: set[str] = set()
    for lib in torch_lib.glob("lib*.so"):
        have |= names(lib, "--defined-only")
    return sorted(wanted - have)


def torch_linked(root: Path) -> list[str]:
    """The compiled files under ``root`` that link libtorch or libc10 directly: built
    against one torch's C++ ABI, each may misread another's tensors even when it loads."""
    out = []
    for so in sorted(root.rglob("*.so")):
        dyn = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True).stdout
        if "libc10" in dyn or "libtorch" in dyn:
            out.append(str(so.relative_to(root)))
    return out


def kernel_load_code(library: Path) -> str:
    """Loads the carried sglang-kernel's sm90 library after torch (its static initializers
    register the ``sgl_kernel`` ops with this torch's dispatcher) and lists what it
    registered; run with the driver stand-in on ``LD_LIBRARY_PATH``."""
    return (
        "import ctypes, json, torch\n"
        f"ctypes.CDLL('{library}', mode=ctypes.RTLD_GLOBAL)\n"
        "ops = torch._C._dispatch_get_all_op_names()\n"
        "mine = sorted(o.split('::', 1)[1] for o in ops if o.startswith('sgl_kernel::'))\n"
        "print(json.dumps({'torch': torch.__version__, 'loaded': True, 'ops': len(mine),"
        " 'rmsnorm_schema': str(torch.ops.sgl_kernel.rmsnorm.default._schema),"
        " 'has': {n: n in mine for n in ('rmsnorm', 'fused_add_rmsnorm', 'silu_and_mul',"
        " 'build_tree_kernel_efficient', 'verify_tree_greedy')}}))\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu/rehearse", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/gpu-rehearsal"), help="work folder")
    ap.add_argument("--venv", type=Path, default=Path("/tmp/gpu-rehearsal-venv"))
    ap.add_argument("--python", help="a CPython 3.12 (default: found on PATH or in pyenv)")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma list of {STEPS}")
    ap.add_argument("--run-args", default="", help="more arguments for gpu/run --rehearse")
    args = ap.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    d = args.dir
    d.mkdir(parents=True, exist_ok=True)
    log = d / "rehearse.log"
    py = args.venv / "bin" / "python"
    tree, carry, kit_work = d / "tree", d / "carry", d / "kit"
    base_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONNOUSERSITE": "1"}
    base_env.pop("PYTHONPATH", None)
    rc = 0
    if "venv" in steps:
        interp = args.python or find_python312()
        if interp is None:
            print("no CPython 3.12 here: the rehearsal would not match the image's 3.12.3")
            return 2
        if not py.is_file():
            rc |= sh([interp, "-m", "venv", str(args.venv)], log)
        rc |= sh([str(py), "-m", "pip", "install", "--progress-bar", "off",
                  *image_requirements()], log, base_env)  # fmt: skip
        rc |= sh([str(py), "-m", "pip", "list", "--format=freeze"], log, base_env)
    if "pack" in steps:
        rc |= sh([sys.executable, str(GPU_DIR / "pack"), "--out", str(carry), "--cache",
                  str(d / "wheels")], log)  # fmt: skip
    if "tree" in steps:
        print(f"[rehearse] {copy_tree(tree)} files of the working tree -> {tree}", flush=True)
    gpu = tree / "gpu"  # the copy the device tool would send
    if "imports" in steps:
        # a server's PYTHONPATH on the lent machine, sgl_kernel from the fallback shim
        site = kit_work / "site"
        if not site.is_dir():
            kit_work.mkdir(parents=True, exist_ok=True)
            rc |= sh(["tar", "-xJf", str(carry / "site.tar.xz"), "-C", str(kit_work)], log)
        env = {**base_env, "PYTHONPATH": os.pathsep.join(
            [str(site), str(gpu / "shims/sgl_kernel_fallback"), str(gpu / "shims/common")])}  # fmt: skip
        rc |= sh([str(py), str(gpu / "gpu_kit/importcheck.py"), "--fake-cuda", "--image",
                  str(gpu / IMAGE_PACKAGES.name), "--carry", str(gpu / CARRY_PINS.name),
                  "--out", str(d / "importcheck.json")], log, env)  # fmt: skip
    if "kernel" in steps:
        ksite = d / "sgl_kernel_site"
        shutil.rmtree(ksite, ignore_errors=True)
        rc |= sh(["tar", "-xJf", str(carry / "sgl_kernel.tar.xz"), "-C", str(d)], log)
        library = next((ksite / "sgl_kernel/sm90").glob("common_ops*.so"))
        torch_lib = next(args.venv.glob("lib/python3*/site-packages/torch/lib"))
        site = kit_work / "site"
        for root in (site, ksite):
            print(f"[rehearse] linked against torch under {root}: {torch_linked(root)}")
        missing = torch_symbols_missing(library, torch_lib)
        print(f"[rehearse] {library.name}: torch symbols undefined in torch: {missing}")
        rc |= bool(missing)
        stub = d / "cuda-stub"
        stub.mkdir(exist_ok=True)
        (stub / "stub.c").write_text(CUDA_STUB_C)
        rc |= sh(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                  str(stub / "libcuda.so.1"), str(stub / "stub.c")], log)  # fmt: skip
        rc |= sh([str(py), "-c", kernel_load_code(library)], log,
                 {**base_env, "LD_LIBRARY_PATH": str(stub)})  # fmt: skip
    if "run" in steps:
        rc |= sh([str(py), str(gpu / "run"), "--rehearse", "--carry", str(carry),
                  "--work", str(kit_work), "--out", str(d / "out"), "--budget", "3600",
                  *args.run_args.split()], log, base_env)  # fmt: skip
    print(f"[rehearse] log: {log}; gpu/run results: {d / 'out' / 'results.json'}")
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
