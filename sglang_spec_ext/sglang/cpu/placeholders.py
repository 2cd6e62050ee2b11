"""PLACEHOLDER MODULES for SGLang's GPU-only imports, for CPU-only serving.

.. warning::

   Nothing here is a kernel. These are *inert stand-ins* that let the host import
   on a machine without sgl-kernel's CPU build. They are installed only when you ask
   for CPU serving (``sglang-spec-ext serve-cpu``, which puts
   :mod:`sglang_spec_ext.sglang.cpu.site` on the server's ``PYTHONPATH``) or in our
   test suite. Importing this module installs nothing; :func:`install` does.

SGLang 0.5.23 imports ``sgl_kernel`` (whose PyPI wheel needs a CUDA driver) from its
speculative workers and ``torchvision`` (whose PyPI build needs CUDA torch) from its
model-config modules, although the CPU engine never calls into either on the paths we
serve. The finder below hands out placeholder modules for exactly those two names, and
only where no real package is importable (a real ``sgl_kernel`` always wins).

Rules the placeholders keep:

* **They refuse loudly.** Calling anything reached through a placeholder raises
  :class:`PlaceholderCalled`, naming the attribute, so a host code path that really
  needs the GPU kernel fails at once instead of computing garbage. (Where the plugin
  has a pure-torch fallback for such a kernel, it replaces the host's binding before
  any call: see :mod:`sglang_spec_ext.sglang.cpu.fallbacks`.)
* **They are invisible to** ``importlib.util.find_spec``: libraries that probe for
  optional packages that way (transformers checks torchvision) keep seeing them as
  absent.
* Every placeholder module carries ``__spec_ext_placeholder__ = True`` and a
  ``__version__`` of ``0.0.0+spec-ext-placeholder`` (some libraries read the version of
  whatever imports).

Standard library only: this runs from ``sitecustomize`` before anything else loads.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

#: The top-level packages served as placeholders when they are not installed.
PLACEHOLDER_ROOTS: tuple[str, ...] = ("sgl_kernel", "torchvision")
PLACEHOLDER_VERSION = "0.0.0+spec-ext-placeholder"
#: Attribute set on every placeholder module and object (read by the CPU fallbacks).
PLACEHOLDER_FLAG = "__spec_ext_placeholder__"


class PlaceholderCalled(RuntimeError):
    """Something called into a placeholder: that host path needs the real GPU package."""


class PlaceholderAttribute:
    """Any attribute of a placeholder module: can be imported and referenced, never used."""

    __spec_ext_placeholder__ = True

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __getattr__(self, attr: str) -> PlaceholderAttribute:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return PlaceholderAttribute(f"{self._qualname}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise PlaceholderCalled(
            f"{self._qualname} was called, but it is a sglang-spec-ext PLACEHOLDER "
            "(the real package is not installed; see sglang_spec_ext.sglang.cpu.placeholders). "
            "This host code path needs the real GPU package: install sgl-kernel (or "
            "torchvision), or use a configuration the CPU engine supports."
        )

    def __mro_entries__(self, bases: tuple) -> tuple:  # `class X(placeholder.Base)` imports
        return (object,)

    def __repr__(self) -> str:
        return f"<sglang-spec-ext placeholder {self._qualname}>"


class PlaceholderModule(types.ModuleType):
    """A placeholder package: every non-dunder attribute is a :class:`PlaceholderAttribute`."""

    def __getattr__(self, attr: str) -> PlaceholderAttribute:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return PlaceholderAttribute(f"{self.__name__}.{attr}")


class _PlaceholderLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = PlaceholderModule(spec.name)
        module.__path__ = []  # a package: its submodules import as placeholders too
        module.__version__ = PLACEHOLDER_VERSION
        setattr(module, PLACEHOLDER_FLAG, True)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _probing_through_find_spec() -> bool:
    """True when the import question comes from ``importlib.util.find_spec``."""
    frame = sys._getframe(2)
    while frame is not None:
        # by module name: importlib.util may be frozen (co_filename "<frozen importlib.util>")
        if frame.f_code.co_name == "find_spec" and frame.f_globals.get("__name__") == (
            "importlib.util"
        ):
            return True
        frame = frame.f_back
    return False


class PlaceholderFinder(importlib.abc.MetaPathFinder):
    """``sys.meta_path`` finder for :data:`PLACEHOLDER_ROOTS`, last in line, never
    shadowing a real package and silent towards ``importlib.util.find_spec``."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] not in PLACEHOLDER_ROOTS:
            return None
        if _probing_through_find_spec():
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            try:
                if finder.find_spec(fullname, path, target) is not None:
                    return None  # the real package is importable: it wins
            except Exception:
                continue
        return importlib.machinery.ModuleSpec(fullname, _PlaceholderLoader(), is_package=True)


def installed() -> bool:
    """Whether :func:`install` has run in this process."""
    return any(isinstance(f, PlaceholderFinder) for f in sys.meta_path)


def install() -> None:
    """Append the placeholder finder to ``sys.meta_path`` (idempotent)."""
    if not installed():
        sys.meta_path.append(PlaceholderFinder())


def is_placeholder(obj: object) -> bool:
    """Whether ``obj`` is a placeholder module or attribute."""
    return bool(getattr(obj, PLACEHOLDER_FLAG, False))
