"""adaptive_replay.py: step-cost truth, controller prior (benchmarks/results/adaptive_replay*.json).

The truth each draft shape is charged with (``sglang_spec_ext.adaptive.prior`` presets:
Llama-3-8B bf16 on one H100 SXM, analytic, nothing measured) and the controller's
configuration, whose cost prior is deliberately wrong so that it must calibrate online.
"""

from __future__ import annotations

from sglang_spec_ext.adaptive.config import CHAIN_DEFAULTS, AdaptiveConfig
from sglang_spec_ext.adaptive.prior import PRESETS, StepCostParams
from sglang_spec_ext.adaptive.simulator import AcceptanceTable

LABEL = "analytic step-cost model (projection, not measured)"
TRUTH_PRESET = "llama3-8b-h100"
#: Draft shape -> the truth preset its steps are charged with.
SHAPE_PRESETS = {
    "suffix": TRUTH_PRESET,
    "standalone": "llama3-8b-h100-standalone-1b",
    "eagle3": "llama3-8b-h100-eagle3",
    "mtp": "llama3-8b-h100-mtp",
}
# The controller's prior is deliberately wrong: it must calibrate from measured times.
CONTROLLER_PRIOR = {
    "cost_mem_bw": 2.0e12,  # truth 2.68e12
    "cost_flops": 4.0e14,  # truth 6.0e14
    "cost_fixed_s": 2.0e-3,  # truth 1.0e-3
    "cost_context_len": 1024.0,  # truth 2048
    "cost_spec_fixed_s": 0.1e-3,  # truth 0.3e-3
    "cost_draft_s_per_req": 5e-6,  # truth 10e-6
}
#: The controller's draft-model prior is wrong too (x truth).
CONTROLLER_DRAFT_PRIOR_SCALE = {
    "draft_weight_bytes": 1.6,
    "draft_kv_bytes_per_token": 0.5,
    "draft_fixed_s": 2.0,
}


def truth_params(shape: str, zero_step: str = "warm") -> StepCostParams:
    """The step-cost truth of a draft shape (``zero_step``: model drafts only)."""
    params = PRESETS[SHAPE_PRESETS[shape]]
    if shape != "suffix" and zero_step in ("skip", "repair"):
        params = params.with_overrides(zero_step_draft=0.0)
    return params


def controller_config(
    table: AcceptanceTable, shape: str = "suffix", zero_step: str = "warm"
) -> AdaptiveConfig:
    """Candidates: the default ones the table has columns for (all of the table's
    budgets if that leaves fewer than three), capped at 32; plus plain decoding.
    Model drafts: every step count of the table, and a wrong draft prior too."""
    ks = [int(k) for k in table.ks[1:] if k <= 32]
    default = AdaptiveConfig().candidate_ks
    cands = [k for k in ks if k in default]
    cands = (0, *(cands if len(cands) >= 3 else ks)) if shape == "suffix" else (0, *ks)
    prior = dict(CONTROLLER_PRIOR)
    if shape != "suffix":
        truth = truth_params(shape, zero_step)
        for name, scale in CONTROLLER_DRAFT_PRIOR_SCALE.items():
            prior["cost_" + name] = getattr(truth, name) * scale
        prior["cost_zero_step_draft"] = truth.zero_step_draft  # the server reads its env
    return AdaptiveConfig(
        candidate_ks=cands,
        max_k=max(cands),
        cost_preset=SHAPE_PRESETS[shape],
        **prior,
        **({} if shape == "suffix" else CHAIN_DEFAULTS),
    )
