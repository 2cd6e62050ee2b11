"""Stand-in for sglang 0.5.23's ``sglang.kernels.ops.gemm.cutedsl_dual_gemm`` on the lent
GPU machine (gpu/run overlays it on the carried sglang).

The real module imports ``cutlass`` (nvidia-cutlass-dsl) at module level, and sglang's
``DualGemm._select_mode`` (srt/layers/dual_gemm.py) imports it while building every dense
MLP on CUDA; the lent image has no cutlass-dsl, so the first GPU run's servers died while
building the model. The fused kernel runs only on SM100 (``can_use_dual_gemm`` checks
``is_sm100_supported()``); the lent machines are SM90, where the host decides "no dual
GEMM" anyway. This stand-in keeps the names ``_select_mode`` reads and answers the same.
"""

from __future__ import annotations

from enum import IntEnum

MAX_DUAL_GEMM_DECODE_TOKENS = 16


class DualGemmQuantMode(IntEnum):
    STATIC_PER_TENSOR = 0
    STATIC_PER_TOKEN = 1
    DYNAMIC_PER_TENSOR = 2
    DYNAMIC_PER_TOKEN = 3
    UNQUANT = 4

    @property
    def is_quantized(self) -> bool:
        return self is not DualGemmQuantMode.UNQUANT

    @property
    def is_dynamic(self) -> bool:
        return self in (DualGemmQuantMode.DYNAMIC_PER_TENSOR, DualGemmQuantMode.DYNAMIC_PER_TOKEN)


def can_use_dual_gemm(
    num_tokens: int, hidden_size: int, intermediate_size: int, quant_mode
) -> bool:
    """SM100-only kernel, and no cutlass-dsl here: never."""
    return False
