"""TEST HARNESS ONLY: placeholder modules for GPU-only imports of the host.

SGLang 0.5.23 imports ``sgl_kernel`` (needs a CUDA driver) from its speculative
workers and ``torchvision`` (whose PyPI build needs CUDA torch) from model
config modules. On a CPU-only test machine neither is importable, although the
CPU engine never calls into them. This finder supplies inert placeholder
modules for exactly those names so the real host code can be imported and run.

It stays invisible to ``importlib.util.find_spec`` so that libraries probing
for optional packages (transformers checks torchvision that way) keep seeing
them as absent. Anything actually *called* on a placeholder raises, so a host
path that really needs the GPU kernel fails loudly instead of silently.

This lives under tests/ on purpose: the product never installs it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

PLACEHOLDER_ROOTS = ("sgl_kernel", "torchvision")
PLACEHOLDER_VERSION = "0.0.0+spec-ext-placeholder"


class _Placeholder:
    """An attribute chain that can be imported/referenced but not used."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._name} is a test-harness placeholder (GPU-only dependency); "
            "this host code path needs the real package"
        )

    def __mro_entries__(self, bases):  # allow `class X(placeholder.Base)`
        return (object,)

    def __repr__(self) -> str:
        return f"<placeholder {self._name}>"


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _PlaceholderModule(spec.name)
        module.__path__ = []  # a package, so submodules import too
        module.__version__ = PLACEHOLDER_VERSION
        module.__spec_ext_placeholder__ = True
        return module

    def exec_module(self, module) -> None:
        return None


def _called_from_find_spec() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "find_spec" and code.co_filename.endswith(
            ("importlib/util.py", "importlib\\util.py")
        ):
            return True
        frame = frame.f_back
    return False


class PlaceholderFinder(importlib.abc.MetaPathFinder):
    """Serves placeholders for PLACEHOLDER_ROOTS when no real package exists."""

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.split(".", 1)[0]
        if root not in PLACEHOLDER_ROOTS or _called_from_find_spec():
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            try:
                if finder.find_spec(fullname, path, target) is not None:
                    return None  # a real package exists: never shadow it
            except Exception:
                continue
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


def install() -> None:
    if not any(isinstance(f, PlaceholderFinder) for f in sys.meta_path):
        sys.meta_path.append(PlaceholderFinder())
