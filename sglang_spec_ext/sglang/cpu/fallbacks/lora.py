"""The host's LoRA serving on a CPU-only machine: no pinned memory where none exists.

sglang 0.5.23's LoRA code stages its small CPU-side tensors (segment lengths, weight
indices, output offsets) and the adapters' CPU copies in pinned memory unconditionally
(``torch.tensor(..., pin_memory=True)``, ``Tensor.pin_memory()`` in ``lora/layers.py``,
``lora/lora.py`` and ``lora/backend/torch_backend.py``). Without an accelerator torch
cannot pin (``RuntimeError: pin_memory=True requires a CUDA or other accelerator
backend``), so ``--enable-lora`` fails at start-up on the CPU engine. Pinning only
speeds up host-to-device copies; on the CPU engine there is no device copy to speed up.

:func:`install_lora_fallbacks` puts an AROUND hook (:func:`unpinned`) on the host's
LoRA entry points (:data:`LORA_TARGETS`) that runs them under :class:`NoPinnedMemory`,
a thread-local ``TorchFunctionMode`` dropping ``pin_memory`` requests; nothing else
changes, and nothing runs in the model's forward pass. Installed only on the CPU
engine and only where pinning really fails (:func:`pinned_memory_unavailable`).

``--lora-backend torch_native`` is the only LoRA backend that runs on the CPU engine:
the host's default ``csgmv`` (and ``triton``, ``triton_v2``) launch Triton GPU kernels
and fail at the first adapted forward (``AttributeError: 'NoneType' object has no
attribute 'replace'`` from ``get_device_name()`` in the kernels' tuning-config lookup),
``ascend`` needs an NPU. :func:`cpu_lora_backend_hook` (BEFORE the host's
``check_lora_server_args``, in the launcher) resolves the default ``csgmv`` to
``torch_native`` on ``--device cpu``, with a warning, and refuses the others with an
error naming the flag.

One host bug is fixed on the way (:func:`per_token_graph_batch_info`): with graph runners
(``SGLANG_SPEC_EXT_CPU_GRAPHS=1`` here, CUDA graphs on a GPU) the ``torch_native`` backend
sizes its graph metadata by request (``max_bs``) but fills it by token
(``weight_indices`` repeated per token), so capturing a verify graph (``num_tokens_per_req``
> 1: any speculative algorithm) fails with ``RuntimeError: The size of tensor a (32) must
match the size of tensor b (256)``. The hook sizes it by token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

logger = logging.getLogger("sglang_spec_ext")

#: What :func:`install_lora_fallbacks` reports when it installs.
LORA_UNPINNED = "lora_unpinned_memory"

_MANAGER = "sglang.srt.lora.lora_manager.LoRAManager"
#: Host functions that allocate pinned memory, directly or below them: the manager's
#: construction (LoRA layers, initial adapters), run-time adapter loads (weights pinned
#: on CPU), the per-batch adapter swap-in and layout, and the torch_native backend's
#: per-batch segment tensors.
LORA_TARGETS: tuple[str, ...] = (
    f"{_MANAGER}.__init__",
    f"{_MANAGER}.load_lora_adapter",
    f"{_MANAGER}.load_lora_adapter_from_tensors",
    f"{_MANAGER}.fetch_new_loras",
    f"{_MANAGER}.prepare_lora_batch",
    f"{_MANAGER}.init_decode_cuda_graph_batch_info",
    "sglang.srt.lora.backend.torch_backend.TorchNativeLoRABackend.prepare_lora_batch",
)


#: The torch_native backend's graph metadata, sized per request by the host.
GRAPH_BATCH_INFO_TARGET = (
    "sglang.srt.lora.backend.torch_backend.TorchNativeLoRABackend.init_decode_cuda_graph_batch_info"
)
#: What :func:`install_lora_fallbacks` reports for :func:`per_token_graph_batch_info`.
LORA_GRAPH_BATCH_INFO = "lora_graph_batch_info_per_token"
#: The host's LoRA server-argument check (runs where server args are checked).
LORA_ARGS_TARGET = "sglang.srt.arg_groups.lora_hook.check_lora_server_args"
#: What :func:`install_lora_fallbacks` reports for :func:`cpu_lora_backend_hook`.
LORA_CPU_BACKEND = "lora_cpu_backend"
CPU_LORA_BACKEND = "torch_native"
#: The host's default ``--lora-backend``, which the CPU engine cannot run.
HOST_DEFAULT_LORA_BACKEND = "csgmv"


class NoPinnedMemory(TorchFunctionMode):
    """Inside this mode ``Tensor.pin_memory()`` returns the tensor itself and factory
    calls get ``pin_memory=False``. Torch function modes are thread-local."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = kwargs or {}
        if func is torch.Tensor.pin_memory:
            return args[0]
        if kwargs.get("pin_memory"):
            kwargs = {**kwargs, "pin_memory": False}
        return func(*args, **kwargs)


def unpinned(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook: run the host's LoRA function with pinning turned into a no-op."""
    with NoPinnedMemory():
        return original(*args, **kwargs)


def per_token_graph_batch_info(original: Callable[..., Any], backend: Any, *args: Any, **kw: Any):
    """AROUND ``TorchNativeLoRABackend.init_decode_cuda_graph_batch_info``: size the graph
    metadata for ``max_bs * num_tokens_per_req`` one-token segments, the layout the
    backend's graph path fills (``weight_indices`` repeated per token, ``seg_lens`` ones)."""
    values = dict(zip(("max_bs_in_cuda_graph", "num_tokens_per_req"), args, strict=False))
    values.update(kw)
    tokens = values["max_bs_in_cuda_graph"] * values["num_tokens_per_req"]
    return original(backend, max_bs_in_cuda_graph=tokens, num_tokens_per_req=1)


def cpu_lora_backend_hook(server_args: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``check_lora_server_args``: on ``--device cpu`` with LoRA on, the host's
    default ``--lora-backend csgmv`` becomes ``torch_native``; other backends but
    ``torch_native`` are refused (each runs kernels the CPU engine lacks)."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    cfg = resolving_view(server_args)
    if cfg.enable_lora is False or not (cfg.enable_lora or cfg.lora_paths):
        return
    if str(cfg.device or "").split(":", 1)[0] != "cpu":
        return
    backend = cfg.lora_backend
    if backend == CPU_LORA_BACKEND:
        return
    if backend != HOST_DEFAULT_LORA_BACKEND:
        raise ValueError(
            f"--lora-backend {backend} does not run on the CPU engine (--device cpu): its "
            f"kernels need a GPU/NPU; use --lora-backend {CPU_LORA_BACKEND}"
        )
    declare_resolution(
        server_args, "sglang_spec_ext.cpu_lora_backend", lora_backend=CPU_LORA_BACKEND
    )
    logger.warning(
        "LoRA on the CPU engine: --lora-backend %s (Triton kernels) resolved to %s; "
        "pass --lora-backend %s to silence this",
        backend,
        CPU_LORA_BACKEND,
        CPU_LORA_BACKEND,
    )


def pinned_memory_unavailable() -> bool:
    """True iff torch cannot pin memory here (no accelerator backend)."""
    try:
        torch.empty(1).pin_memory()
    except RuntimeError:
        return True
    return False


def install_lora_fallbacks(registry: Any = None, hook_type: Any = None) -> list[str]:
    """Register :func:`cpu_lora_backend_hook` and :func:`unpinned` (on every target in
    :data:`LORA_TARGETS`); the caller applies the hooks. ``[]`` unless on the CPU engine
    without pinned memory; only what the host has to patch is reported. Idempotent."""
    from sglang_spec_ext.sglang.host.platform import host_runs_cpu_engine

    if not host_runs_cpu_engine() or not pinned_memory_unavailable():
        return []
    if registry is None or hook_type is None:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        registry, hook_type = HookRegistry, HookType
    from sglang_spec_ext.sglang.cpu.fallbacks.registry import register_patch

    installed = []
    if (
        register_patch(registry, hook_type.BEFORE, LORA_ARGS_TARGET, cpu_lora_backend_hook)
        is not None
    ):
        installed.append(LORA_CPU_BACKEND)
    graphs = register_patch(
        registry, hook_type.AROUND, GRAPH_BATCH_INFO_TARGET, per_token_graph_batch_info
    )
    if graphs is not None:
        installed.append(LORA_GRAPH_BATCH_INFO)
    done = [register_patch(registry, hook_type.AROUND, t, unpinned) for t in LORA_TARGETS]
    missing = [t for t, d in zip(LORA_TARGETS, done, strict=True) if d is None]
    if missing:
        logger.warning("sglang-spec-ext: LoRA CPU fallback cannot patch %s", ", ".join(missing))
    if any(d is not None for d in done):
        installed.append(LORA_UNPINNED)
    logger.debug("LoRA CPU fallbacks registered: %s", installed)
    return installed
