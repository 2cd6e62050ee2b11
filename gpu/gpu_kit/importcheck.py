"""Import the host's CUDA-path modules and say which fail and why (one JSON object).

On the lent GPU machine ``gpu/run`` runs this in a subprocess as its environment stage:
real CUDA, the carried packages on ``PYTHONPATH``. On a development machine it is the
CPU check of the carry: ``--fake-cuda`` makes torch report one Hopper GPU (so the host
takes its CUDA branches at import), and ``--image FILE --carry FILE`` hides every
installed distribution that is neither on the lent machine's image nor carried, so a
package the carry forgot fails here as it would there::

    python gpu/gpu_kit/importcheck.py --fake-cuda --image gpu/image-packages.txt \
        --carry gpu/carry.txt

Standard library only before the imports it checks.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import re
import sys
import sysconfig
import time
import traceback
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: What ``python -m sglang.launch_server`` imports on the kit's path, in the launcher,
#: scheduler and detokenizer processes, plus the speculative workers the stages use.
CUDA_PATH_MODULES: tuple[str, ...] = (
    "sglang.utils",
    "sglang.srt.server_args",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.managers.scheduler",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "sglang.srt.models.llama",
    "sglang.srt.layers.layernorm",
    "sglang.srt.layers.sampler",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.speculative.spec_utils",
    "sglang.srt.speculative.ngram_worker",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.speculative.standalone_worker_v2",
    "sglang.srt.speculative.cpp_ngram.ngram_corpus",
)


def normalize(name: str) -> str:
    """A distribution name in PEP 503 normal form."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_names(path: Path) -> set[str]:
    """Distribution names of a requirements-like file (comments, versions, markers dropped)."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(normalize(re.split(r"[\s=<>!~;\[]", line, maxsplit=1)[0]))
    return names


def fake_cuda() -> None:
    """Make this process's torch report one H100 (for imports on a machine without one)."""
    import torch

    class _Props:
        major, minor, name = 9, 0, "NVIDIA H100 80GB HBM3 (faked by gpu kit)"
        total_memory, multi_processor_count = 80 * 2**30, 132

    torch.cuda.is_available = lambda: True
    torch.version.cuda = "13.0"
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_name = lambda *a, **k: _Props.name
    torch.cuda.get_device_properties = lambda *a, **k: _Props()


class HideFinder(importlib.abc.MetaPathFinder):
    """Refuses top-level imports that only hidden distributions provide."""

    def __init__(self, hidden: dict[str, list[str]]) -> None:
        self.hidden = hidden  # import name -> the hidden distributions providing it
        self.refused: dict[str, list[str]] = {}
        self.site = [
            str(Path(p).resolve())
            for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        ]

    def _from_site(self, top: str) -> bool:
        """Whether ``top`` would come from the environment's site-packages (and not
        from an earlier ``sys.path`` entry such as the kit's shims)."""
        spec = importlib.machinery.PathFinder.find_spec(top)
        where = spec.origin if spec and spec.origin else None
        if spec and spec.submodule_search_locations:
            where = next(iter(spec.submodule_search_locations), where)
        return bool(where) and any(str(Path(where).resolve()).startswith(s) for s in self.site)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        top = fullname.split(".", 1)[0]
        if top in self.hidden and self._from_site(top):
            self.refused[top] = self.hidden[top]
            raise ModuleNotFoundError(
                f"No module named {top!r} (hidden: distribution {self.hidden[top]} "
                "is neither on the lent machine's image nor carried)",
                name=top,
            )
        return None


class _Anything(types.ModuleType):
    """A placeholder module: every attribute is another placeholder, never to be called."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        sub = _Anything(f"{self.__name__}.{attr}")
        sub.__path__ = []
        return sub

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.__name__} is a gpu-kit import-check placeholder")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


class PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stands in for packages the lent image has but this machine cannot install (the CPU
    check only: torchvision needs CUDA torch). Invisible to ``importlib.util.find_spec``,
    as transformers probes torchvision that way."""

    def __init__(self, roots: Iterable[str], visible: bool = False) -> None:
        self.roots = set(roots)
        self.visible = visible

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".", 1)[0] not in self.roots:
            return None
        frame = sys._getframe(1)
        if self.visible:
            frame = None
        while frame is not None:
            if (
                frame.f_code.co_name == "find_spec"
                and frame.f_globals.get("__name__") == "importlib.util"
            ):
                return None
            frame = frame.f_back
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Anything(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+gpu-kit-placeholder"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _fake_dist_info(names: Iterable[str], version: str = "0.26.0") -> None:
    """A dist-info per placeholder on ``sys.path`` (importlib.metadata finds a version)."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="gpu-kit-dist-"))
    for name in names:
        info = root / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    sys.path.append(str(root))


def hidden_imports(allowed: set[str]) -> dict[str, list[str]]:
    """Import names whose installed distributions are all outside ``allowed``."""
    out: dict[str, list[str]] = {}
    for top, dists in importlib.metadata.packages_distributions().items():
        if top.startswith("_") and top != "_cffi_backend":
            continue
        if not any(normalize(d) in allowed for d in dists):
            out[top] = sorted({normalize(d) for d in dists})
    return out


def check(modules: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Import each module; per module ``ok``, seconds, and on failure the error and tail."""
    results: dict[str, dict[str, Any]] = {}
    for name in modules:
        t0 = time.perf_counter()
        try:
            importlib.import_module(name)
            results[name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 2)}
        except BaseException as exc:  # noqa: BLE001 - every failure is the finding
            if isinstance(exc, KeyboardInterrupt):
                raise
            results[name] = {
                "ok": False,
                "seconds": round(time.perf_counter() - t0, 2),
                "error": f"{type(exc).__name__}: {exc}"[:800],
                "missing_module": getattr(exc, "name", None)
                if isinstance(exc, ModuleNotFoundError)
                else None,
                "tail": traceback.format_exc(limit=-6)[-2500:],
            }
    return results


def sgl_kernel_report() -> dict[str, Any]:
    """Which ``sgl_kernel`` imports, from where, and whether it is the kit's fallback."""
    try:
        import sgl_kernel

        return {
            "version": getattr(sgl_kernel, "__version__", None),
            "file": getattr(sgl_kernel, "__file__", None),
            "fallback": bool(getattr(sgl_kernel, "GPU_KIT_FALLBACK", False)),
        }
    except BaseException as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"[:800]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help="modules to import (default: the CUDA path)")
    ap.add_argument("--fake-cuda", action="store_true", help="torch reports one H100")
    ap.add_argument("--image", type=Path, help="the lent image's package list")
    ap.add_argument("--carry", type=Path, help="the carry's pins (gpu/carry.txt)")
    ap.add_argument("--allow", action="append", default=[], help="also allow this dist")
    ap.add_argument(
        "--placeholder",
        action="append",
        default=[],
        help="serve this package as an inert placeholder (CPU check: torchvision)",
    )
    ap.add_argument(
        "--visible-placeholders",
        action="store_true",
        help="placeholders are found by importlib.util.find_spec and have a dist-info "
        "(name==version from --image), as a real installed package is",
    )
    ap.add_argument("--out", type=Path, help="write the JSON here too")
    args = ap.parse_args(argv)
    finder = None
    if args.image or args.carry:
        allowed = {normalize(a) for a in args.allow}
        for path in (args.image, args.carry):
            if path:
                allowed |= read_names(path)
        finder = HideFinder(hidden_imports(allowed))
        sys.meta_path.insert(0, finder)
    if args.placeholder:
        sys.meta_path.append(PlaceholderFinder(args.placeholder, args.visible_placeholders))
        if args.visible_placeholders:
            _fake_dist_info(args.placeholder)
    if args.fake_cuda:
        fake_cuda()
    t0 = time.perf_counter()
    results = check(args.modules or CUDA_PATH_MODULES)
    torch = sys.modules.get("torch")
    report = {
        "python": sys.version.split()[0],
        "torch": getattr(torch, "__version__", None),
        "cuda_reported": bool(torch and torch.cuda.is_available()),
        "cuda_faked": args.fake_cuda,
        "placeholders": args.placeholder,
        "seconds": round(time.perf_counter() - t0, 2),
        "ok": all(r["ok"] for r in results.values()),
        "failed": sorted(m for m, r in results.items() if not r["ok"]),
        "missing_modules": sorted(
            {r["missing_module"] for r in results.values() if r.get("missing_module")}
        ),
        "hidden_refused": finder.refused if finder else None,
        "sgl_kernel": sgl_kernel_report(),
        "modules": results,
    }
    text = json.dumps(report, indent=1, sort_keys=True)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
