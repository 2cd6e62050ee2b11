"""Pure-torch gates of Qwen3-Next layers the host runs in Triton on a CPU without AMX.

* The GDN layers' gated output norm. The host's ``FusedRMSNormGated`` (``kernels/ops/attention/fla/fused_norm_gate.py``) calls
sgl-kernel's ``fused_rmsnorm_gated_cpu`` only where the CPU has AMX; elsewhere it calls
the Triton ``rms_norm_gated``, which has no CPU driver. :func:`rms_norm_gated_hook` (AROUND
that function) computes CPU tensors here, as the Triton kernel does (float32, the norm
before the gate), and leaves GPU tensors to the host.
* The shared expert's sigmoid gate (``srt/models/qwen2_moe.py``, every Qwen2-MoE-style
  MoE with a shared-expert gate): ``fused_gate_sigmoid_mul(_add)`` launch a Triton kernel
  (``kernels/ops/elementwise/elementwise.py``, ``_launch_fused_gate_sigmoid_mul``);
  :func:`gate_sigmoid_mul_hook` computes CPU tensors here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

NORM_TARGET = "sglang.kernels.ops.attention.fla.fused_norm_gate.rms_norm_gated"
GATE_TARGET = "sglang.kernels.ops.elementwise.elementwise._launch_fused_gate_sigmoid_mul"


def rms_norm_gated_cpu(
    x: torch.Tensor,
    g: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    activation: str = "swish",
    residual: torch.Tensor | None = None,
    prenorm: bool = False,
    residual_in_fp32: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``rmsnorm(x [+ residual]) * weight [+ bias]``, times ``silu(g)`` (``swish``/``silu``)
    or ``sigmoid(g)``, over the last dimension; ``(y, x + residual)`` with ``prenorm``."""
    shape = x.shape
    xf = x.reshape(-1, shape[-1]).float()
    if residual is not None:
        xf = xf + residual.reshape(xf.shape).float()
    y = xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    gf = g.reshape(xf.shape).float()
    if activation in ("swish", "silu"):
        y = y * gf * torch.sigmoid(gf)
    elif activation == "sigmoid":
        y = y * torch.sigmoid(gf)
    else:
        raise ValueError(f"unsupported activation {activation!r}")
    y = y.to(x.dtype).reshape(shape)
    if not prenorm:
        return y
    res_dtype = torch.float32 if residual_in_fp32 else x.dtype
    return y, xf.to(res_dtype).reshape(shape)


def rms_norm_gated_hook(original: Callable[..., Any], x: torch.Tensor, *args: Any,
                        **kwargs: Any) -> Any:  # fmt: skip
    """AROUND the host's Triton ``rms_norm_gated``: CPU tensors take :func:`rms_norm_gated_cpu`."""
    if x.device.type == "cpu":
        return rms_norm_gated_cpu(x, *args, **kwargs)
    return original(x, *args, **kwargs)


def gate_sigmoid_mul_hook(
    original: Callable[..., Any],
    hidden_states: torch.Tensor,
    gate_weight: torch.Tensor,
    shared_output: torch.Tensor,
    output: torch.Tensor,
    *,
    do_add: bool,
) -> None:
    """AROUND the host's shared-expert gate launch: on CPU tensors, ``output (+)=
    sigmoid(hidden_states @ gate_weight) * shared_output`` per token, in float32."""
    if hidden_states.device.type != "cpu":
        return original(hidden_states, gate_weight, shared_output, output, do_add=do_add)
    gate = torch.sigmoid(hidden_states.float() @ gate_weight.float())[:, None]
    value = gate * shared_output.float()
    if do_add:
        value = value + output.float()
    output.copy_(value.to(output.dtype))
    return None
