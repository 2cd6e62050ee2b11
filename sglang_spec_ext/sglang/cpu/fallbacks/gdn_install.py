"""Install the GDN fallbacks (:mod:`.gdn_ops`) where the host's CPU engine lacks the kernels.

The host binds its GDN CPU kernels at import of its GDN modules, in two ways:

* ``from sgl_kernel.mamba import causal_conv1d_fn_cpu, ...``: without sgl-kernel's CPU
  build that module is a placeholder (``cpu/placeholders.py``); we set the three names on
  it, so the host's import binds ours. A host GDN module imported before us keeps the
  placeholder it bound: those bindings are replaced in place.
* ``torch.ops.sgl_kernel.fused_gdn_gating_cpu`` (and the recurrent update), read at
  import: where no such op is registered with a CPU kernel we set the attribute on the
  ``torch.ops.sgl_kernel`` namespace, before the host's import reads it.

The commit after a verify (``commit_mamba_states_after_verify`` -> the host's
``scatter_mamba_states_after_mtp_verify``) scatters each request's accepted step through
two Triton functions that refuse CPU tensors; AROUND hooks route CPU tensors to
:func:`.gdn_ops.mamba_state_scatter_with_mask` and leave GPU tensors to the host. The GDN
layers' gated output norm and the shared expert's gate go the same way on a CPU without
AMX (:mod:`.layer_gates`).
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch

from sglang_spec_ext.sglang.cpu.fallbacks import gdn_ops, layer_gates
from sglang_spec_ext.sglang.cpu.fallbacks.registry import register_patch

logger = logging.getLogger("sglang_spec_ext")

PLACEHOLDER_FLAG = "__spec_ext_placeholder__"

#: ``sgl_kernel.mamba`` names the host imports on its CPU engine.
MAMBA_MODULE_OPS: dict[str, Callable[..., Any]] = {
    "causal_conv1d_fn_cpu": gdn_ops.causal_conv1d_fn_cpu,
    "causal_conv1d_update_cpu": gdn_ops.causal_conv1d_update_cpu,
    "chunk_gated_delta_rule_cpu": gdn_ops.chunk_gated_delta_rule_cpu,
}
#: ``torch.ops.sgl_kernel`` ops the host reads at import.
TORCH_OPS: dict[str, Callable[..., Any]] = {
    "fused_gdn_gating_cpu": gdn_ops.fused_gdn_gating_cpu,
    "fused_sigmoid_gating_delta_rule_update_cpu": (
        gdn_ops.fused_sigmoid_gating_delta_rule_update_cpu
    ),
}
#: Host modules binding the ops at import: module -> {attribute: op name}.
HOST_BINDINGS: dict[str, dict[str, str]] = {
    "sglang.srt.layers.attention.linear.gdn_backend": {
        "causal_conv1d_fn_cpu": "causal_conv1d_fn_cpu",
        "causal_conv1d_fn": "causal_conv1d_fn_cpu",
        "causal_conv1d_update_cpu": "causal_conv1d_update_cpu",
        "causal_conv1d_update": "causal_conv1d_update_cpu",
        "fused_gdn_gating": "fused_gdn_gating_cpu",
    },
    "sglang.srt.layers.attention.linear.kernels.gdn_triton": {
        "chunk_gated_delta_rule_cpu": "chunk_gated_delta_rule_cpu",
        "chunk_gated_delta_rule": "chunk_gated_delta_rule_cpu",
        "fused_sigmoid_gating_delta_rule_update": "fused_sigmoid_gating_delta_rule_update_cpu",
    },
}
_SCATTER = "sglang.kernels.ops.mamba.mamba_state_scatter_triton"
SCATTER_TARGETS = (
    f"{_SCATTER}.fused_mamba_state_scatter_with_mask",
    f"{_SCATTER}.fused_conv_window_scatter_with_mask",
)
SCATTER_MULTI_TARGET = f"{_SCATTER}.fused_conv_window_scatter_multi"


def _torch_op_on_cpu(name: str) -> bool:
    """Whether ``torch.ops.sgl_kernel.<name>`` is a registered op with a CPU kernel."""
    try:
        packet = getattr(torch.ops.sgl_kernel, name)
    except (AttributeError, RuntimeError):
        return False
    qualified = getattr(packet, "_qualified_op_name", None)
    if qualified is None:
        return False  # a plain attribute (ours, or another plugin's): not a kernel
    try:
        return bool(torch._C._dispatch_has_computed_kernel_for_dispatch_key(qualified, "CPU"))
    except Exception:
        return True


def _mamba_module() -> Any:
    """``sgl_kernel.mamba`` if it imports (a placeholder where sgl-kernel is missing)."""
    try:
        return importlib.import_module("sgl_kernel.mamba")
    except Exception:
        return None


def _is_placeholder(value: object) -> bool:
    return bool(getattr(value, PLACEHOLDER_FLAG, False))


def scatter_hook(original: Callable[..., None], dst: torch.Tensor, src: torch.Tensor,
                 *args: Any, **kwargs: Any) -> None:  # fmt: skip
    """AROUND the host's Triton state scatters: CPU tensors take the torch version."""
    if dst.device.type == "cpu" and src.device.type == "cpu":
        return gdn_ops.mamba_state_scatter_with_mask(dst, src, *args, **kwargs)
    return original(dst, src, *args, **kwargs)


def scatter_multi_hook(
    original: Callable[..., None],
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
    state_indices: torch.Tensor,
    steps: torch.Tensor,
    track_indices: torch.Tensor | None = None,
    track_steps: torch.Tensor | None = None,
) -> None:
    """AROUND the host's one-launch conv-window scatter of every conv type (bf16 pools):
    on CPU tensors, each pair's scatter, then its track slots."""
    if pairs[0][0].device.type != "cpu":
        return original(pairs, state_indices, steps, track_indices, track_steps)
    for dst, src in pairs:
        gdn_ops.mamba_state_scatter_with_mask(dst, src, state_indices, steps)
        if track_indices is not None:
            gdn_ops.mamba_state_scatter_with_mask(dst, src, track_indices, track_steps)
    return None


def install_gdn_fallbacks(registry: Any, hook_type: Any) -> tuple[list[str], bool]:
    """Bind the GDN ops the host lacks and hook the commit's scatters.

    Returns (what is covered, whether anything was newly installed). Call only on the
    CPU engine, before the host imports its GDN modules; idempotent."""
    ours: dict[str, Callable[..., Any]] = {}
    new = False
    for name, impl in TORCH_OPS.items():
        if _torch_op_on_cpu(name):
            continue
        if getattr(torch.ops.sgl_kernel, name, None) is not impl:
            setattr(torch.ops.sgl_kernel, name, impl)
            new = True
        ours[name] = impl
    module = _mamba_module()
    if module is not None and _is_placeholder(module):
        for name, impl in MAMBA_MODULE_OPS.items():
            if module.__dict__.get(name) is not impl:
                setattr(module, name, impl)
                new = True
            ours[name] = impl
    for host_module, attrs in HOST_BINDINGS.items():  # imported before us: rebind
        loaded = sys.modules.get(host_module)
        for attr, op in attrs.items() if loaded is not None else ():
            if op in ours and _is_placeholder(getattr(loaded, attr, None)):
                setattr(loaded, attr, ours[op])
                new = True
    covered = sorted(ours)
    if ours:
        done = [
            register_patch(registry, hook_type.AROUND, t, scatter_hook) for t in SCATTER_TARGETS
        ]
        done.append(
            register_patch(registry, hook_type.AROUND, SCATTER_MULTI_TARGET, scatter_multi_hook)
        )
        if any(d is not None for d in done):
            covered.append("mamba_state_scatter_cpu")
        gates = [
            register_patch(registry, hook_type.AROUND, layer_gates.NORM_TARGET,
                           layer_gates.rms_norm_gated_hook),
            register_patch(registry, hook_type.AROUND, layer_gates.GATE_TARGET,
                           layer_gates.gate_sigmoid_mul_hook),
        ]  # fmt: skip
        covered += [n for n, d in zip(("rms_norm_gated_cpu", "gate_sigmoid_mul_cpu"), gates,
                                      strict=True) if d is not None]  # fmt: skip
        new = new or any(done) or any(gates)
    return covered, new
