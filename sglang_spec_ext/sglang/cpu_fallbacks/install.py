"""Install the pure-torch fallbacks into the host, where (and only where) it needs them.

The host binds each CPU kernel at import time (``if _is_cpu: from sgl_kernel import
X_cpu``) and calls that module attribute from its dispatch functions. Where the
sgl-kernel CPU build is missing, those calls fail; we replace the bindings through
the host's own ``HookRegistry`` (``HookType.REPLACE``), which also rebinds stale
``from X import Y`` copies. Nothing happens unless the host runs its CPU engine, and
a fallback is never installed for an op the host really has (:func:`host_has_op`).
"""

from __future__ import annotations

import functools
import logging
import pkgutil
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sglang_spec_ext.sglang.cpu_fallbacks import ops
from sglang_spec_ext.sglang.cpu_fallbacks.verify_attention import forward_extend_hook

logger = logging.getLogger("sglang_spec_ext")

#: The flag the test harness puts on its placeholder modules (tests/harness/shim).
PLACEHOLDER_FLAG = "__spec_ext_placeholder__"

_OPS = "sglang.kernels.ops"


@dataclass(frozen=True)
class Fallback:
    """One host kernel: its torch op name, the host attributes bound to it, our version."""

    op: str
    targets: tuple[str, ...]
    impl: Callable[..., None]
    source_module: str = "sgl_kernel"  # where the host imports it from


FALLBACKS: tuple[Fallback, ...] = (
    Fallback(
        "copy_all_layer_kv_cache_cpu",
        (f"{_OPS}.kvcache.cache_move.copy_all_layer_kv_cache_cpu",),
        ops.copy_all_layer_kv_cache_cpu,
    ),
    Fallback(
        "assign_req_to_token_pool_cpu",
        ("sglang.srt.mem_cache.allocation.assign_req_to_token_pool_cpu",),
        ops.assign_req_to_token_pool_cpu,
    ),
    Fallback(
        "assign_extend_cache_locs_cpu",
        (f"{_OPS}.speculative.cache_locs.assign_extend_cache_locs_cpu",),
        ops.assign_extend_cache_locs_cpu,
    ),
    Fallback(
        "assign_draft_cache_locs_contiguous_cpu",
        (f"{_OPS}.speculative.cache_locs.assign_draft_cache_locs_contiguous_cpu",),
        ops.assign_draft_cache_locs_contiguous_cpu,
    ),
    Fallback(
        "fill_accept_out_cache_loc_cpu",
        (f"{_OPS}.speculative.eagle.fill_accept_out_cache_loc_cpu",),
        ops.fill_accept_out_cache_loc_cpu,
    ),
    Fallback(
        "fill_bonus_tokens_cpu",
        (f"{_OPS}.speculative.eagle.fill_bonus_tokens_cpu",),
        ops.fill_bonus_tokens_cpu,
    ),
    Fallback(
        "build_tree_kernel_efficient_cpu",
        (f"{_OPS}.speculative.spec_tree.sgl_build_tree_kernel_efficient_cpu",),
        ops.build_tree_kernel_efficient_cpu,
    ),
    Fallback(
        "verify_tree_greedy_cpu",
        (f"{_OPS}.speculative.spec_tree.sgl_verify_tree_greedy_cpu",),
        ops.verify_tree_greedy_cpu,
    ),
    Fallback(
        "reconstruct_indices_from_tree_mask",
        (f"{_OPS}.speculative.reconstruct_tree.reconstruct_indices_from_tree_mask",),
        ops.reconstruct_indices_from_tree_mask,
        source_module="sgl_kernel.speculative",
    ),
)

_BY_OP: dict[str, Fallback] = {f.op: f for f in FALLBACKS}

#: The host's torch_native attention backend has no TARGET_VERIFY path (0.5.23).
VERIFY_ATTENTION = "torch_native_target_verify"
VERIFY_ATTENTION_TARGET = (
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend"
)


def host_runs_cpu_engine() -> bool:
    """True iff the host's own platform probes say: CPU engine, and no GPU/NPU backend."""
    from sglang.srt import utils as host_utils

    if not host_utils.is_cpu():
        return False
    for probe in ("is_cuda", "is_hip", "is_xpu", "is_npu", "is_musa"):
        check = getattr(host_utils, probe, None)
        if check is not None and check():
            return False
    return True


def _torch_op_is_callable_on_cpu(name: str) -> bool:
    try:
        packet = getattr(torch.ops.sgl_kernel, name)
    except (AttributeError, RuntimeError):
        return False
    try:  # a schema without a CPU (or composite) kernel cannot run here
        return bool(
            torch._C._dispatch_has_computed_kernel_for_dispatch_key(
                packet._qualified_op_name, "CPU"
            )
        )
    except Exception:  # private API moved: resolving the op is all we can check
        return True


_REAL_CALLABLES = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    functools.partial,
    torch._ops.OpOverloadPacket,
    torch._ops.OpOverload,
)


def _is_placeholder(value: object, source_module: str) -> bool:
    """Whether a host binding is a test-harness placeholder rather than a real kernel.

    Hook wrappers (ours included) are looked through to the binding they replaced.
    """
    seen = 0
    while hasattr(value, "__wrapped__") and seen < 16:
        value, seen = value.__wrapped__, seen + 1
    if getattr(value, PLACEHOLDER_FLAG, False):
        return True
    owner = sys.modules.get(getattr(value, "__module__", None) or "")
    if owner is not None and getattr(owner, PLACEHOLDER_FLAG, False):
        return True
    source = sys.modules.get(source_module)
    flagged = source is not None and getattr(source, PLACEHOLDER_FLAG, False)
    return bool(flagged) and not isinstance(value, _REAL_CALLABLES)


def _resolve(target: str) -> tuple[Any, str]:
    """(owner object, attribute name) of a dotted host path; imports as needed."""
    owner, attr = target.rsplit(".", 1)
    return pkgutil.resolve_name(owner), attr


def host_has_op(name: str) -> bool:
    """Whether the host has a real implementation of kernel ``name``.

    A real sgl-kernel build registers its ops in the ``torch.ops.sgl_kernel``
    namespace, so the op must resolve there (with a kernel usable on CPU), and the
    host's own binding of it must not be a test-harness placeholder.
    """
    if not _torch_op_is_callable_on_cpu(name):
        return False
    fallback = _BY_OP.get(name)
    if fallback is None:
        return True
    for target in fallback.targets:
        try:
            module, attr = _resolve(target)
        except (ImportError, AttributeError):
            continue
        if hasattr(module, attr) and _is_placeholder(getattr(module, attr), fallback.source_module):
            return False
    return True


def _already_registered(registry: type, target: str, impl: Callable[..., None]) -> bool:
    hooks = getattr(registry, "_hooks", {}).get(target, ())
    return any(hook is impl for _type, hook, _src in hooks)


def _register(registry: Any, hook_type: Any, target: str, impl: Callable[..., Any]) -> bool | None:
    """Register ``impl`` on ``target``: True if newly registered, False if it already
    was, None if the host does not bind ``target`` (nothing to patch)."""
    try:
        owner, attr = _resolve(target)
    except (ImportError, AttributeError) as e:
        logger.warning("sglang-spec-ext: cannot patch %s: %s", target, e)
        return None
    # HookRegistry rebinds every module attribute that `is` the original: never
    # let that original be None (or anything else shared), only a real binding.
    if getattr(owner, attr, None) is None:
        logger.debug("%s is not bound by the host; nothing to replace", target)
        return None
    if _already_registered(registry, target, impl):
        return False
    registry.register(target, impl, hook_type)
    return True


def install_cpu_fallbacks() -> list[str]:
    """Replace the host's missing CPU kernels by :mod:`.ops`; return what is covered.

    Does nothing (returns ``[]``) unless the host runs its CPU engine. Skips every op
    :func:`host_has_op` finds, and ops whose host module cannot be imported or does not
    bind the kernel. Also adds target-verify support to the ``torch_native`` attention
    backend (:data:`VERIFY_ATTENTION`). Idempotent: a second call registers nothing new
    and returns the same list.
    """
    if not host_runs_cpu_engine():
        logger.debug("not the CPU engine: no CPU kernel fallbacks")
        return []
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    installed: list[str] = []
    present: list[str] = []
    new = False
    for fallback in FALLBACKS:
        if host_has_op(fallback.op):
            present.append(fallback.op)
            continue
        done = [
            _register(HookRegistry, HookType.REPLACE, t, fallback.impl) for t in fallback.targets
        ]
        if any(d is not None for d in done):
            installed.append(fallback.op)
        new = new or any(done)
    done_attention = _register(
        HookRegistry, HookType.AROUND, VERIFY_ATTENTION_TARGET, forward_extend_hook
    )
    if done_attention is not None:
        installed.append(VERIFY_ATTENTION)
    new = new or bool(done_attention)
    HookRegistry.apply_hooks()
    if present:
        logger.info("host has real CPU kernels, kept: %s", ", ".join(present))
    if new:
        # WARNING, not INFO: plugins load before the host configures logging, and
        # running speculative decoding on these (slower) fallbacks is worth a line.
        logger.warning("sglang-spec-ext: pure-torch CPU fallbacks in use: %s", ", ".join(installed))
    return installed
