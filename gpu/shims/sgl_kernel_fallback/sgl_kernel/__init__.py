"""GPU KIT FALLBACK for ``sgl_kernel`` (not a kernel library).

SGLang 0.5.23 imports ``sgl_kernel`` at module level on CUDA with no switch to skip it.
``gpu/run`` puts this package on ``PYTHONPATH`` only when the carried sglang-kernel 0.4.5
sm90 library cannot be loaded on the lent machine (or none was carried). It gives:

* pure-torch versions of the few kernels a dense Llama calls on the kit's path
  (``--attention-backend triton --sampling-backend pytorch``): ``rmsnorm``,
  ``fused_add_rmsnorm``, ``gemma_rmsnorm``, ``gemma_fused_add_rmsnorm``,
  ``silu_and_mul``, ``gelu_and_mul``, ``weak_ref_tensor`` (returns the tensor itself:
  a strong reference, so graph outputs stay allocated; correct, uses more memory) and
  ``utils.is_arch_support_pdl`` (False: no programmatic dependent launch);
* for every other name, in this package and in any ``sgl_kernel.<sub>`` module, an
  object that can be imported and referenced but raises :class:`FallbackCalled` when
  called, naming itself, so a path that needs a real kernel fails loudly.

Timings taken with this fallback are not the host's: the results say which was used.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+gpu-kit-fallback"
GPU_KIT_FALLBACK = True


class FallbackCalled(RuntimeError):
    """A host path called an sgl_kernel op the gpu kit's fallback does not implement."""


class _Missing:
    """Any attribute the fallback does not implement: importable, never callable."""

    GPU_KIT_FALLBACK = True

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __getattr__(self, attr: str) -> _Missing:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._qualname}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise FallbackCalled(
            f"{self._qualname} was called, but sgl_kernel is the gpu kit's fallback "
            "(gpu/shims/sgl_kernel_fallback): the real sglang-kernel library did not load"
        )

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)

    def __repr__(self) -> str:
        return f"<gpu-kit sgl_kernel fallback {self._qualname}>"


def _rms(x: Any, weight: Any, eps: float, gemma: bool) -> Any:
    import torch

    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    w = weight.float() + 1.0 if gemma else weight.float()
    return (y * w).to(x.dtype)


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):  # noqa: A002
    y = _rms(input, weight, eps, gemma=False)
    if out is not None:
        out.copy_(y)
        return out
    return y


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):  # noqa: A002
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps, gemma=False))


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):  # noqa: A002
    y = _rms(input, weight, eps, gemma=True)
    if out is not None:
        out.copy_(y)
        return out
    return y


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):  # noqa: A002
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps, gemma=True))


def silu_and_mul(input, out=None, enable_pdl=None):  # noqa: A002
    import torch.nn.functional as F

    d = input.shape[-1] // 2
    y = F.silu(input[..., :d]) * input[..., d:]
    if out is not None:
        out.copy_(y)
        return out
    return y


def gelu_and_mul(input, out=None, enable_pdl=None):  # noqa: A002
    import torch.nn.functional as F

    d = input.shape[-1] // 2
    y = F.gelu(input[..., :d]) * input[..., d:]
    if out is not None:
        out.copy_(y)
        return out
    return y


def weak_ref_tensor(tensor):
    return tensor


def is_arch_support_pdl() -> bool:
    return False


#: Names the fallback implements, by the submodule sgl_kernel defines them in.
IMPLEMENTED: dict[str, dict[str, Any]] = {
    "elementwise": {
        "rmsnorm": rmsnorm,
        "fused_add_rmsnorm": fused_add_rmsnorm,
        "gemma_rmsnorm": gemma_rmsnorm,
        "gemma_fused_add_rmsnorm": gemma_fused_add_rmsnorm,
        "silu_and_mul": silu_and_mul,
        "gelu_and_mul": gelu_and_mul,
    },
    "memory": {"weak_ref_tensor": weak_ref_tensor},
    "utils": {"is_arch_support_pdl": is_arch_support_pdl},
}


class _FallbackModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self.__name__}.{attr}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _FallbackModule(spec.name)
        module.__path__ = []
        module.__version__ = __version__
        module.GPU_KIT_FALLBACK = True
        for name, fn in IMPLEMENTED.get(spec.name.split(".", 1)[1], {}).items():
            setattr(module, name, fn)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _SubmoduleFinder(importlib.abc.MetaPathFinder):
    """Serves every ``sgl_kernel.<sub>`` import as a fallback module."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SubmoduleFinder())


def __getattr__(attr: str) -> Any:
    if attr.startswith("__") and attr.endswith("__"):
        raise AttributeError(attr)
    return _Missing(f"{__name__}.{attr}")
