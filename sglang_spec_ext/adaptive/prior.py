"""Analytic prior of the step-cost model ``t(bs, k)``: seconds for one speculative
decode step, from physical constants (:class:`StepCostParams`, presets, and
:func:`sized_prior` for the served models). Calibration on measured times:
:mod:`.cost`.

``bs`` requests each verify ``k`` draft tokens plus the root, so the target forward
processes ``n = bs * (k + 1)`` tokens (``k = 0`` is plain decoding).

Analytic prior (a roofline; no calibration run needed)
------------------------------------------------------
Decode is memory-bound: every step streams the weights once and each request's KV
cache once, whatever the number of query tokens; only beyond a roofline knee does
the matrix-multiply work on ``n`` tokens dominate::

    t(bs, k) = fixed + [k > 0] * (spec_fixed + bs * draft_per_req)
               + d(k) * (draft_step + bs * draft_step_per_req)         # draft model
               + max(weights + bs * kv_per_req + n * act_per_token,   # memory time
                     n * flop_per_token)                               # compute time

with the nine coefficients (seconds) derived from physical constants
(:class:`StepCostParams`)::

    fixed          = fixed_s                         launch, sampling, scheduler
    spec_fixed     = spec_fixed_s                    tree mask, verify, bookkeeping
    draft_per_req  = draft_s_per_req                 host-side drafting per request
    draft_step     = draft_fixed_s + draft_weight_bytes / mem_bw      one draft forward
    draft_step_per_req = context_len * draft_kv_bytes_per_token / mem_bw
    weights        = weight_bytes / mem_bw
    kv_per_req     = context_len * kv_bytes_per_token / mem_bw
    act_per_token  = act_bytes_per_token / mem_bw
    flop_per_token = (flops_per_token + attn_flops_per_ctx_token * context_len) / flops

``d(k)`` is the number of draft-model forwards of a step: ``k`` for a chain of ``k``
model-drafted tokens (``k - 1`` draft decodes and the draft extend over the
accepted tokens) and ``zero_step_draft`` at ``k = 0`` (1 where the host keeps the
draft KV cache warm by running the draft extend at zero steps, its default; 0 where
``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND`` skips it). Model-free drafters have no
draft model: their draft constants are 0 and the term vanishes.

The default constants describe Llama-3-8B in bf16 on one H100 SXM (80 GB HBM3):
16.06 GB of weights, 3.35 TB/s peak bandwidth at 80 % efficiency (2.68e12 B/s),
989 TFLOP/s dense bf16 at ~60 % (6e14 FLOP/s), 2 x 8.03e9 FLOP per token for the
matmuls, GQA KV of 32 layers x 8 heads x 128 dims x 2 (K, V) x 2 bytes = 128 KiB
per token, a mean context of 2048 tokens, attention 4 x 32 layers x 4096 FLOP per
query token per context token, ~1 MB of activation traffic per token, 1 ms fixed
overhead per step, 0.3 ms extra per speculative step and 10 us of drafting per
request. That gives ~7.1 ms per plain step at bs=1 (~140 tok/s), a knee near
200 tokens at bs=1 and KV reads that dominate at large batch sizes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

COEFF_NAMES: tuple[str, ...] = (
    "fixed",
    "spec_fixed",
    "draft_per_req",
    "draft_step",
    "draft_step_per_req",
    "weights",
    "kv_per_req",
    "act_per_token",
    "flop_per_token",
)


@dataclass(frozen=True)
class StepCostParams:
    """Physical constants of the analytic step-cost prior (SI units)."""

    weight_bytes: float = 16.06e9
    mem_bw: float = 2.68e12
    flops: float = 6.0e14
    flops_per_token: float = 1.606e10
    kv_bytes_per_token: float = 131072.0
    context_len: float = 2048.0
    act_bytes_per_token: float = 1.0e6
    attn_flops_per_ctx_token: float = 524288.0
    fixed_s: float = 1.0e-3
    spec_fixed_s: float = 0.3e-3
    draft_s_per_req: float = 10e-6
    # draft model (0 for model-free drafters); see the module docstring
    draft_weight_bytes: float = 0.0
    draft_kv_bytes_per_token: float = 0.0
    draft_fixed_s: float = 0.0
    zero_step_draft: float = 0.0  # draft forwards at k = 0 (0 or 1)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            positive = f.name in ("mem_bw", "flops")
            ok = isinstance(value, (int, float)) and math.isfinite(value)
            ok = ok and (value > 0 if positive else value >= 0)
            if not ok:
                rng = "(0, inf)" if positive else "[0, inf)"
                raise ValueError(f"StepCostParams.{f.name}={value!r}: expected a number in {rng}")
        if self.zero_step_draft > 1:
            raise ValueError(
                f"StepCostParams.zero_step_draft={self.zero_step_draft!r}: expected 0 or 1 "
                "(draft forwards at zero steps)"
            )

    def coefficients(self) -> np.ndarray:
        """The model coefficients in seconds, ordered as ``COEFF_NAMES``."""
        return np.array(
            [
                self.fixed_s,
                self.spec_fixed_s,
                self.draft_s_per_req,
                self.draft_fixed_s + self.draft_weight_bytes / self.mem_bw,
                self.context_len * self.draft_kv_bytes_per_token / self.mem_bw,
                self.weight_bytes / self.mem_bw,
                self.context_len * self.kv_bytes_per_token / self.mem_bw,
                self.act_bytes_per_token / self.mem_bw,
                (self.flops_per_token + self.attn_flops_per_ctx_token * self.context_len)
                / self.flops,
            ],
            dtype=np.float64,
        )

    def with_overrides(self, **overrides: float | None) -> StepCostParams:
        """A copy with the non-``None`` overrides applied."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


PRESETS: dict[str, StepCostParams] = {
    # Llama-3-8B bf16, one H100 SXM (the default; see the module docstring).
    "llama3-8b-h100": StepCostParams(),
    # Llama-3-70B bf16, tensor parallel over 4 H100 SXM (per-GPU shares; TP all-reduce
    # folded into the fixed overhead).
    "llama3-70b-tp4-h100": StepCostParams(
        weight_bytes=141.1e9 / 4,
        flops=6.0e14,
        flops_per_token=1.411e11 / 4,
        kv_bytes_per_token=327680.0 / 4,
        attn_flops_per_ctx_token=4 * 80 * 8192 / 4,
        act_bytes_per_token=2.0e6,
        fixed_s=2.0e-3,
    ),
}
# Model drafts for the Llama-3-8B / H100 target: the draft forwards stream the draft's
# weights and KV once each (memory-bound), plus a launch overhead per forward (CUDA
# graph replay). The host's default keeps the draft KV warm at zero steps.
#   EAGLE-3 head: one decoder layer (0.44 GB) + fc (0.10 GB) + a 32k-vocab lm_head
#   (0.27 GB) in bf16; KV of one layer, 8 KV heads x 128 dims x 2 x 2 bytes.
PRESETS["llama3-8b-h100-eagle3"] = PRESETS["llama3-8b-h100"].with_overrides(
    draft_weight_bytes=0.81e9,
    draft_kv_bytes_per_token=4096.0,
    draft_fixed_s=0.15e-3,
    zero_step_draft=1.0,
)
#   MTP layer (NEXTN: the target's own multi-token-prediction layer drafts): one target
#   decoder layer, attention 4096 x (4096 + 2 x 1024 + 4096) + MLP 3 x 4096 x 14336 =
#   218.1M parameters (0.436 GB), + input_proj [H, 2H] 2 x 4096 x 4096 x 2 bytes
#   (0.067 GB), + the target's own full-vocabulary lm_head 128256 x 4096 x 2 bytes
#   (1.051 GB, shared with the target but streamed again by every draft forward; EAGLE-3
#   has a 32k draft vocab) = 1.554 GB in bf16 (the shared embedding is only gathered,
#   one row per token); KV of one layer, 8 KV heads x 128 dims x 2 x 2 bytes = 4096 B.
#   Launches as an EAGLE head (one layer); the host runs it on its EAGLE path, draft
#   extend at zero steps included.
PRESETS["llama3-8b-h100-mtp"] = PRESETS["llama3-8b-h100"].with_overrides(
    draft_weight_bytes=1.554e9,
    draft_kv_bytes_per_token=4096.0,
    draft_fixed_s=0.15e-3,
    zero_step_draft=1.0,
)
#   STANDALONE with Llama-3.2-1B: 2.47 GB of bf16 weights, 16 layers x 8 KV heads x 64
#   dims x 2 x 2 bytes of KV per token.
PRESETS["llama3-8b-h100-standalone-1b"] = PRESETS["llama3-8b-h100"].with_overrides(
    draft_weight_bytes=2.47e9,
    draft_kv_bytes_per_token=32768.0,
    draft_fixed_s=0.25e-3,
    zero_step_draft=1.0,
)


#: Device constants of the prior on a CPU (the SGLang CPU engine): ~20 GB/s of memory
#: bandwidth, ~100 GFLOP/s, and tens of milliseconds of Python and scheduling per
#: forward. Rough by design: calibration fits the rest; what matters is the shape (a
#: draft forward costs a sizeable fraction of a target forward, and a small model is
#: compute-bound after a few tokens).
CPU_DEVICE: dict[str, float] = {
    "mem_bw": 2.0e10,
    "flops": 1.0e11,
    "fixed_s": 20e-3,
    "spec_fixed_s": 5e-3,
    "draft_fixed_s": 10e-3,
    "draft_s_per_req": 0.1e-3,
}


@dataclass(frozen=True)
class ModelSizes:
    """What the served models weigh: parameters, bytes of weights and bytes of KV cache
    per token (per GPU under tensor parallelism), target and draft."""

    device: str
    target_params: float
    target_bytes: float
    target_kv_bytes_per_token: float
    draft_params: float = 0.0
    draft_bytes: float = 0.0
    draft_kv_bytes_per_token: float = 0.0


#: The constants :func:`sized_prior` sets (the rest stay the preset's).
SIZED_FIELDS: tuple[str, ...] = (
    "weight_bytes",
    "flops_per_token",
    "kv_bytes_per_token",
    "attn_flops_per_ctx_token",
    "draft_weight_bytes",
    "draft_kv_bytes_per_token",
    *CPU_DEVICE,
)


def sized_prior(base: StepCostParams, sizes: ModelSizes) -> StepCostParams:
    """``base`` (a preset) with the served models' sizes in place of the preset's, and a
    CPU's device constants where ``sizes.device`` is ``"cpu"`` (GPUs keep the preset's:
    calibration scales them to the device at hand). Attention FLOPs per context token
    scale with the target's KV bytes (layers x KV heads x head dim)."""
    kv_ratio = sizes.target_kv_bytes_per_token / base.kv_bytes_per_token
    overrides: dict[str, float] = {
        "weight_bytes": sizes.target_bytes,
        "flops_per_token": 2.0 * sizes.target_params,
        "kv_bytes_per_token": sizes.target_kv_bytes_per_token,
        "attn_flops_per_ctx_token": base.attn_flops_per_ctx_token * kv_ratio,
    }
    if base.draft_weight_bytes > 0:  # model drafts: the draft's own sizes
        overrides["draft_weight_bytes"] = sizes.draft_bytes
        overrides["draft_kv_bytes_per_token"] = sizes.draft_kv_bytes_per_token
    if sizes.device == "cpu":
        overrides.update(CPU_DEVICE)
    return base.with_overrides(**overrides)


#: Coefficients added to both roofline branches (the rest are memory or compute terms).
N_COMMON = 5


def features(
    bs: np.ndarray,
    k: np.ndarray,
    zero_step_draft: float = 0.0,
    verify_widths: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample terms multiplying each coefficient: one ``(m, 9)`` matrix for the
    memory branch and one for the compute branch; ``t = max`` of their products with
    the coefficient vector. ``verify_widths[k]``: tokens verified per request at ``k``
    (default ``k + 1``; tree drafts of ``k`` draft steps verify more)."""
    bs = np.asarray(bs, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    spec = (k > 0).astype(np.float64)
    if verify_widths is None:
        n = bs * (k + 1.0)
    else:
        n = bs * np.asarray(verify_widths, dtype=np.float64)[k.astype(np.int64)]
    drafts = np.where(k > 0, k, zero_step_draft)  # draft-model forwards per step
    zero = np.zeros_like(bs)
    one = np.ones_like(bs)
    common = np.stack([one, spec, spec * bs, drafts, drafts * bs, zero, zero, zero, zero], axis=-1)
    mem = np.stack([zero, zero, zero, zero, zero, one, bs, n, zero], axis=-1)
    comp = np.stack([zero, zero, zero, zero, zero, zero, zero, zero, n], axis=-1)
    return common + mem, common + comp


def analytic_step_time(
    coeffs: np.ndarray,
    bs: np.ndarray | int,
    k: np.ndarray | int,
    zero_step_draft: float = 0.0,
    verify_widths: np.ndarray | None = None,
) -> np.ndarray:
    """``t(bs, k)`` of the roofline formula for the given coefficient vector."""
    bs_arr, k_arr = np.broadcast_arrays(np.atleast_1d(bs), np.atleast_1d(k))
    f_mem, f_comp = features(bs_arr, k_arr, zero_step_draft, verify_widths)
    return np.maximum(f_mem @ coeffs, f_comp @ coeffs)


def draft_extend_time(params: StepCostParams, tokens: int, requests: int) -> float:
    """Seconds of one prefill-shaped draft forward over ``tokens`` tokens of ``requests``
    requests (the draft-KV repair after skipped zero steps): the draft's weights once and
    each request's draft KV once, or its matmuls (2 FLOP per parameter, as many
    parameters as bf16 weight bytes / 2) where those take longer."""
    if tokens <= 0:
        return 0.0
    memory = (
        params.draft_weight_bytes + requests * params.context_len * params.draft_kv_bytes_per_token
    ) / params.mem_bw
    compute = tokens * params.draft_weight_bytes / params.flops
    return params.draft_fixed_s + max(memory, compute)


def step_time(params: StepCostParams, bs: np.ndarray | int, k: np.ndarray | int) -> np.ndarray:
    """``t(bs, k)`` of the roofline formula for physical constants ``params``."""
    return analytic_step_time(params.coefficients(), bs, k, params.zero_step_draft)


def ragged_step_costs(params: StepCostParams, bs: int, width: int) -> tuple[float, float, float]:
    """``(t0, e, b)`` in seconds for a ragged verify step of ``bs`` requests (each verifies
    its own draft nodes, ``suffix/lengths.py``) from the roofline: ``t0`` the plain decode
    step, ``e`` what any verify step adds (tree mask, verify, per-request bookkeeping),
    ``b`` one more verified draft node, the secant of the roofline from no draft node to
    every request at ``width`` (a node is nearly free while decode is memory-bound, a
    whole token's matmuls once compute-bound: a CPU at once, a GPU past its knee).
    Model-free drafts: the draft-model terms are 0."""
    coeffs = params.coefficients()
    spec_fixed, per_req = coeffs[1], coeffs[2]
    bs = max(int(bs), 1)
    span = bs * max(int(width) - 1, 1)
    t0 = float(analytic_step_time(coeffs, bs, 0)[0])
    e = float(spec_fixed + bs * per_req)
    full = float(analytic_step_time(coeffs, bs, max(int(width) - 1, 1))[0])
    b = max(full - t0 - e, 0.0) / span
    return t0, e, b
