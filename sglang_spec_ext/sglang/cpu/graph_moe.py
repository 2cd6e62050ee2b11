"""Graph-safe MoE for the CPU graph emulation (``SGLANG_SPEC_EXT_CPU_GRAPHS=1``).

The host's CPU MoE without ``sgl_kernel``'s fused experts (``moe_forward_native`` in
``srt/layers/moe/fused_moe_native.py``) counts the tokens routed to each expert, reads
the counts into Python (``.cpu().numpy()``) and loops over the experts that got any,
slicing the sorted tokens by those counts. Captured into a graph, the counts of the
capture batch are burned in: every replay routes its tokens by the capture's counts,
which is wrong as soon as the router chooses differently (plain decoding included).
A GPU runs a capturable fused-MoE kernel instead.

:func:`moe_forward_graph_safe` is that capturable form on the CPU: every expert runs on
every token (fixed shapes, no host read), each token then takes its own experts' rows
by ``topk_ids`` and combines them with ``topk_weights`` exactly as the host does
(the same activation, biases, and weighted sum over the top-k in the same order). It
costs ``num_experts / top_k`` times the expert work, which a test bed's tiny MoE
affords. It is used only while a graph is being captured (what the capture records is
what every replay runs); eager forwards keep the host's loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from sglang_spec_ext.sglang.cpu.graph_capture import is_capturing

#: The host's CPU MoE fallback (imported by the unquantized method at call time).
TARGET = "sglang.srt.layers.moe.fused_moe_native.moe_forward_native"


def _activation(moe_runner_config: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The host's gate/up activation for ``moe_runner_config`` (as ``moe_forward_native``
    picks it)."""
    from sglang.srt.layers.activation import GeluAndMul, SiluAndMul, SituAndMul
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import (
        swiglu_gpt_oss_sigmoid_alpha,
    )

    activation = moe_runner_config.activation
    if activation == "silu" and moe_runner_config.gemm1_alpha is not None:
        alpha, limit = moe_runner_config.gemm1_alpha, moe_runner_config.gemm1_clamp_limit
        return lambda x: swiglu_gpt_oss_sigmoid_alpha(x, alpha, limit)
    if activation == "silu":
        return SiluAndMul()
    if activation == "gelu":
        return GeluAndMul()
    if activation == "situ":
        beta = moe_runner_config.gemm1_alpha if moe_runner_config.gemm1_alpha is not None else 4.0
        return SituAndMul(beta=beta, linear_beta=moe_runner_config.gemm1_clamp_limit)
    raise ValueError(f"Unsupported activation: {activation=}")


def moe_forward_graph_safe(
    layer: torch.nn.Module, x: torch.Tensor, topk_output: Any, moe_runner_config: Any
) -> torch.Tensor:
    """``moe_forward_native``'s result with no host read: ``x`` [T, H] through every
    expert, then each token's top-k rows weighted and summed. Returns [T, H]."""
    if moe_runner_config.apply_router_weight_on_input:
        raise NotImplementedError()
    topk_weights, topk_ids, _ = topk_output
    act = _activation(moe_runner_config)
    w13_bias = getattr(layer, "w13_weight_bias", None)
    w2_bias = getattr(layer, "w2_weight_bias", None)
    per_expert = []
    for i in range(layer.num_experts):  # a Python loop over a constant: recorded once
        gate_up = F.linear(x, layer.w13_weight[i])
        if w13_bias is not None:
            gate_up = (gate_up.float() + w13_bias[i]).to(x.dtype)
        out = F.linear(act(gate_up), layer.w2_weight[i])
        if w2_bias is not None:
            out = (out.float() + w2_bias[i]).to(x.dtype)
        per_expert.append(out)
    every = torch.stack(per_expert, dim=1)  # [T, E, H]
    ids = topk_ids.to(torch.int64).unsqueeze(-1).expand(-1, -1, every.shape[-1])
    chosen = every.gather(1, ids)  # [T, K, H]: the host's new_x, in top-k order
    return (
        chosen.type(topk_weights.dtype)
        .mul_(topk_weights.unsqueeze(dim=-1))
        .sum(dim=1)
        .type(chosen.dtype)
    )


def moe_forward_hook(original: Callable[..., torch.Tensor], *a: Any, **kw: Any) -> torch.Tensor:
    """AROUND ``moe_forward_native``: the graph-safe form while a graph is captured, the
    host's loop otherwise."""
    if is_capturing():
        return moe_forward_graph_safe(*a, **kw)
    return original(*a, **kw)


def moe_hooks() -> list[tuple[str, Any, Any]]:
    """``(target, hook, HookType)`` for ``register_hooks_once``."""
    from sglang.srt.plugins.hook_registry import HookType

    return [(TARGET, moe_forward_hook, HookType.AROUND)]
