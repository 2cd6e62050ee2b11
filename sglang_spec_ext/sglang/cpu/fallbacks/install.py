"""Install the pure-torch fallbacks into the host, where (and only where) it needs them.

The host binds each CPU kernel at import time (``if _is_cpu: from sgl_kernel import
X_cpu``) and calls that module attribute from its dispatch functions. Where the
sgl-kernel CPU build is missing, those calls fail; we replace the bindings through
the host's own ``HookRegistry`` (``HookType.REPLACE``), which also rebinds stale
``from X import Y`` copies. Nothing happens unless the host runs its CPU engine, and
a fallback is never installed for an op the host really has (:func:`host_has_op`).

Sampling verify is different: there the host binds ``None`` where it has no kernel
(``tree_speculative_sampling_target_only``, ``top_k_renorm_prob``,
``top_p_renorm_prob``) and its verify goes greedy on CPU. ``HookRegistry`` must never
patch a ``None`` (it rebinds every module attribute that *is* the original), so
:func:`bind_unset_fallback` sets those named attributes directly, and an AROUND hook
on ``_verify_uses_greedy`` (:func:`verify_uses_greedy_hook`) lets sampled requests
take the sampling path once all three are bound.
"""

from __future__ import annotations

import functools
import logging
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sglang_spec_ext.sglang.cpu.fallbacks import lora, ops, sampling
from sglang_spec_ext.sglang.cpu.fallbacks.gdn_install import install_gdn_fallbacks
from sglang_spec_ext.sglang.cpu.fallbacks.registry import register_patch, resolve_target
from sglang_spec_ext.sglang.cpu.fallbacks.verify_attention import forward_extend_hook
from sglang_spec_ext.sglang.host.platform import host_runs_cpu_engine

logger = logging.getLogger("sglang_spec_ext")

#: The flag on the placeholder modules for CPU serving (:mod:`..cpu_placeholders`).
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


@dataclass(frozen=True)
class UnsetFallback:
    """A host op bound to ``None`` where the host has no kernel for it: the defining
    module's attribute first, then the modules that copied it with ``from X import``."""

    op: str
    targets: tuple[str, ...]
    impl: Callable[..., Any]


_EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"

UNSET_FALLBACKS: tuple[UnsetFallback, ...] = (
    UnsetFallback(
        "tree_speculative_sampling_target_only",
        (
            f"{_OPS}.speculative.verify_sampling.tree_speculative_sampling_target_only",
            f"{_EAGLE_UTILS}.tree_speculative_sampling_target_only",
        ),
        sampling.tree_speculative_sampling_target_only,
    ),
    UnsetFallback(
        "top_k_renorm_prob",
        (f"{_OPS}.sampling.renorm.top_k_renorm_prob", f"{_EAGLE_UTILS}.top_k_renorm_prob"),
        sampling.top_k_renorm_prob,
    ),
    UnsetFallback(
        "top_p_renorm_prob",
        (f"{_OPS}.sampling.renorm.top_p_renorm_prob", f"{_EAGLE_UTILS}.top_p_renorm_prob"),
        sampling.top_p_renorm_prob,
    ),
)

_UNSET_BY_OP: dict[str, UnsetFallback] = {f.op: f for f in UNSET_FALLBACKS}

#: On CPU, sampled requests are verified by tree speculative sampling, not greedily.
SAMPLING_VERIFY = "cpu_sampling_verify"
SAMPLING_VERIFY_TARGET = f"{_EAGLE_UTILS}._verify_uses_greedy"

#: The host's torch_native attention backend has no TARGET_VERIFY path (0.5.23).
VERIFY_ATTENTION = "torch_native_target_verify"
VERIFY_ATTENTION_TARGET = (
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend"
)


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
    """Whether a host binding is a placeholder (:mod:`..cpu_placeholders`), not a real kernel.

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


def _host_binding(fallback: UnsetFallback) -> Any:
    """The host's own binding of ``fallback.op`` (its defining module), or None."""
    try:
        owner, attr = resolve_target(fallback.targets[0])
    except (ImportError, AttributeError):
        return None
    return getattr(owner, attr, None)


def host_has_op(name: str) -> bool:
    """Whether the host has a real implementation of kernel ``name``.

    A real sgl-kernel build registers its ops in the ``torch.ops.sgl_kernel``
    namespace, so the op must resolve there (with a kernel usable on CPU), and the
    host's own binding of it must not be a placeholder. For the ops
    the host binds to ``None`` when it lacks them (:data:`UNSET_FALLBACKS`), the
    host has the op iff that binding is set, to something other than ours.
    """
    unset = _UNSET_BY_OP.get(name)
    if unset is not None:
        bound = _host_binding(unset)
        return bound is not None and bound is not unset.impl
    if not _torch_op_is_callable_on_cpu(name):
        return False
    fallback = _BY_OP.get(name)
    if fallback is None:
        return True
    for target in fallback.targets:
        try:
            module, attr = resolve_target(target)
        except (ImportError, AttributeError):
            continue
        if hasattr(module, attr) and _is_placeholder(getattr(module, attr), fallback.source_module):
            return False
    return True


def bind_unset_fallback(fallback: UnsetFallback) -> bool | None:
    """Set every target of ``fallback`` that the host left ``None`` to our version.

    Returns True if one was newly set, False if all are ours already, None if the
    host binds none of them (nothing to do). A target holding anything else (a real
    kernel) is left alone. Direct assignment, because ``HookRegistry`` would rebind
    every module attribute that is ``None``.
    """
    ours = new = False
    for target in fallback.targets:
        try:
            owner, attr = resolve_target(target)
        except (ImportError, AttributeError) as e:
            logger.warning("sglang-spec-ext: cannot bind %s: %s", target, e)
            continue
        if not hasattr(owner, attr):
            logger.debug("%s is not bound by the host; nothing to set", target)
            continue
        current = getattr(owner, attr)
        if current is None:
            setattr(owner, attr, fallback.impl)
            ours = new = True
        elif current is fallback.impl:
            ours = True
    return new if ours else None


def cpu_sampling_verify_ready() -> bool:
    """Whether the host's EAGLE/NGRAM verify can call every sampling op it needs."""
    module = sys.modules.get(_EAGLE_UTILS)
    return module is not None and all(
        getattr(module, f.op, None) is not None for f in UNSET_FALLBACKS
    )


def verify_uses_greedy_hook(original: Callable[..., bool], *args: Any, **kwargs: Any) -> bool:
    """AROUND ``eagle_utils._verify_uses_greedy``: on CPU, verify sampled requests by
    tree speculative sampling once its ops are bound (:func:`cpu_sampling_verify_ready`).

    Greedy batches stay greedy; rejection sampling (``--speculative-use-rejection-sampling``)
    uses a Triton kernel the CPU cannot run, so it keeps the host's greedy fallback.
    """
    if (
        kwargs.get("is_cpu")
        and not kwargs.get("use_rejection_sampling")
        and cpu_sampling_verify_ready()
    ):
        kwargs["is_cpu"] = False
    return original(*args, **kwargs)


def install_cpu_fallbacks() -> list[str]:
    """Replace the host's missing CPU kernels by :mod:`.ops`; return what is covered.

    Does nothing (returns ``[]``) unless the host runs its CPU engine. Skips every op
    :func:`host_has_op` finds, and ops whose host module cannot be imported or does not
    bind the kernel. Also adds target-verify support to the ``torch_native`` attention
    backend (:data:`VERIFY_ATTENTION`), binds the sampling-verify ops the host leaves
    ``None`` (:data:`UNSET_FALLBACKS`) and, once all are bound, lets sampled requests
    use them (:data:`SAMPLING_VERIFY`), and covers the Gated DeltaNet kernels of hybrid
    linear-attention models (:mod:`.gdn_install`). Idempotent: a second call registers
    nothing new and returns the same list.
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
            register_patch(HookRegistry, HookType.REPLACE, t, fallback.impl)
            for t in fallback.targets
        ]
        if any(d is not None for d in done):
            installed.append(fallback.op)
        new = new or any(done)
    done_attention = register_patch(
        HookRegistry, HookType.AROUND, VERIFY_ATTENTION_TARGET, forward_extend_hook
    )
    if done_attention is not None:
        installed.append(VERIFY_ATTENTION)
    new = new or bool(done_attention)
    for unset in UNSET_FALLBACKS:
        if host_has_op(unset.op):
            present.append(unset.op)
            continue
        bound = bind_unset_fallback(unset)
        if bound is not None:
            installed.append(unset.op)
        new = new or bool(bound)
    if cpu_sampling_verify_ready():
        done_sampling = register_patch(
            HookRegistry, HookType.AROUND, SAMPLING_VERIFY_TARGET, verify_uses_greedy_hook
        )
        if done_sampling is not None:
            installed.append(SAMPLING_VERIFY)
        new = new or bool(done_sampling)
    gdn, gdn_new = install_gdn_fallbacks(HookRegistry, HookType)  # GDN linear attention
    installed += gdn
    new = new or gdn_new
    lora.install_lora_fallbacks(HookRegistry, HookType)  # --enable-lora (logs itself)
    HookRegistry.apply_hooks()
    if present:
        logger.info("host has real CPU kernels, kept: %s", ", ".join(present))
    if new:
        # WARNING, not INFO: plugins load before the host configures logging, and
        # running speculative decoding on these (slower) fallbacks is worth a line.
        logger.warning("sglang-spec-ext: pure-torch CPU fallbacks in use: %s", ", ".join(installed))
    return installed
