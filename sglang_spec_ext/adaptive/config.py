"""``AdaptiveConfig``: validated settings of the adaptive draft-width controller.

Every field maps to an environment variable ``SGLANG_SPEC_EXT_ADAPTIVE_<FIELD>`` (field
name upper-cased; tuples as comma-separated lists; the mapping lives in
``sglang_spec_ext.config``). The ``cost_*`` fields override single constants of the
``cost_preset`` analytic step-cost prior (see :mod:`.cost`); ``None`` keeps the preset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from .prior import PRESETS, StepCostParams


def _fail(name: str, value: object, accepted: str) -> None:
    raise ValueError(f"AdaptiveConfig.{name}={value!r}: expected {accepted}")


def _check_num(name: str, value: object, lo: float, hi: float, *, lo_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
        _fail(name, value, f"a number in {'(' if lo_open else '['}{lo}, {hi}]")


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi):
        _fail(name, value, f"an integer in [{lo}, {hi}]")


def _check_int_tuple(name: str, value: object, lo: int, hi: int) -> None:
    ok = isinstance(value, tuple) and len(value) > 0
    ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi for v in value)
    if not ok:
        _fail(name, value, f"a non-empty tuple of integers in [{lo}, {hi}]")


#: What model drafts with topk 1 change (``k`` = draft steps): acceptance per depth,
#: exploration that backs off once a tier settles (each probe costs draft forwards), and
#: a narrow tie band: the per-depth estimate is exact for chains, so a 0.3-1% predicted
#: gain of one more step is real (a 1% band, which sends near-ties to fewer steps, cost
#: up to 0.8% at batch 16-32 in the STANDALONE code-edit replay); and an exploration
#: budget, since a probe of one more draft step can cost several plain steps where the
#: draft forward is dear (a CPU). Tree widths keep it off: there the probes also feed
#: the paired differences the estimates lean on (adaptive/paired.py).
CHAIN_DEFAULTS: dict[str, object] = {
    "draft_shape": "chain",
    "probe_backoff": 4,
    "tie_tolerance": 0.003,
    "probe_budget": 0.01,
    "probe_budget_thin": 0.05,
    "probe_budget_upshift": 0.001,
}


@dataclass(frozen=True)
class AdaptiveConfig:
    # which k (draft nodes per request; verify width W = k + 1) may be chosen
    candidate_ks: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
    max_k: int = 32  # cap (host verify width - 1); larger candidates are dropped
    tiers: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # batch-size tiers
    # per tier (in the order of ``tiers``): a k to use there always (a candidate by
    # that), -1 = the controller chooses; hand-set tiers as the host's EMA has them
    # (benchmarks, known optima)
    pinned_ks: tuple[int, ...] | None = None
    # "tree": k draft nodes of a best-first tree (model-free drafts); "chain": k draft
    # steps of a topk-1 model draft (acceptance per depth, adaptive/chain.py)
    draft_shape: str = "tree"
    # tokens verified per request at each k (index k; default k + 1): a tree draft of k
    # draft steps verifies more than k + 1 (topk > 1 model drafts)
    verify_widths: tuple[int, ...] | None = None
    # acceptance estimator
    prior_accept: float = 0.6  # Beta prior mean of the per-depth conditional acceptance
    prior_strength: float = 2.0  # Beta prior pseudo-observations
    decay: float = 0.998  # forgetting factor per verify step
    structure_sd: float = 0.1  # relative sd of a budget's guess from its neighbours
    paired_strength: float = 1.0  # pseudo-pairs of the model against paired probe data
    per_request: bool = True  # per-request estimates when request ids are supplied
    request_strength: float = 16.0  # pseudo-steps pulling a request to the global curve
    request_decay: float = 0.998  # forgetting factor per step of that request
    level_strength: float = 4.0  # pseudo-steps of the server-wide level (no request ids)
    level_decay: float = 0.95  # forgetting factor per step of the server-wide level
    max_tracked_requests: int = 4096
    # policy
    switch_margin: float = 0.03  # relative predicted gain that switches after switch_confirm
    switch_confirm: int = 3  # decisions a gain above the margin must persist
    switch_patience: int = 16  # decisions a smaller gain must persist
    tie_tolerance: float = 0.01  # predicted goodputs this close count as tied (larger k wins)
    probe_interval: int = 16  # decisions between probes of a neighbour (0 = never)
    probe_interval_thin: int = 8  # decisions between probes of a thin neighbour
    probe_max_loss: float = 0.15  # skip probes predicted to lose more (when well known)
    # double the probe intervals every this many probes without a switch (0 = never)
    probe_backoff: int = 0
    # probes lose at most this fraction of a tier's time (thin neighbours: _thin);
    # 1 = no limit beyond the intervals (trees; chains: CHAIN_DEFAULTS)
    probe_budget: float = 1.0
    probe_budget_thin: float = 1.0
    # probes up from zero steps that rebuild skipped draft KV (the draft-KV repair)
    probe_budget_upshift: float = 1.0
    probe_min_evidence: float = 32.0  # acceptance observations under which a k is "thin"
    probe_min_timed: float = 8.0  # measured step times (per tier) under which a k is "thin"
    # step-cost model
    cost_preset: str = "llama3-8b-h100"
    calibrate: bool = True  # fit the cost model to measured step times
    cost_window: int = 2048  # measured steps kept for the fit
    cost_decay: float = 0.999  # per-sample recency weight
    cost_refit_every: int = 16
    cost_prior_weight: float = 16.0  # pseudo-samples of the prior per coefficient
    cost_weight_bytes: float | None = None
    cost_mem_bw: float | None = None
    cost_flops: float | None = None
    cost_flops_per_token: float | None = None
    cost_kv_bytes_per_token: float | None = None
    cost_context_len: float | None = None
    cost_act_bytes_per_token: float | None = None
    cost_attn_flops_per_ctx_token: float | None = None
    cost_fixed_s: float | None = None
    cost_spec_fixed_s: float | None = None
    cost_draft_s_per_req: float | None = None
    cost_draft_weight_bytes: float | None = None
    cost_draft_kv_bytes_per_token: float | None = None
    cost_draft_fixed_s: float | None = None
    cost_zero_step_draft: float | None = None

    def __post_init__(self) -> None:
        _check_int("max_k", self.max_k, 0, 1024)
        _check_int_tuple("candidate_ks", self.candidate_ks, 0, 1024)
        if not any(k <= self.max_k for k in self.candidate_ks):
            _fail("candidate_ks", self.candidate_ks, f"at least one value <= max_k={self.max_k}")
        _check_int_tuple("tiers", self.tiers, 1, 1 << 20)
        if self.pinned_ks is not None:  # -1: the controller chooses at that tier
            _check_int_tuple("pinned_ks", self.pinned_ks, -1, 1024)
            if len(self.pinned_ks) != len(self.tiers):
                _fail("pinned_ks", self.pinned_ks, f"one k per tier ({len(self.tiers)} values)")
            if max(self.pinned_ks) > self.max_k:
                _fail("pinned_ks", self.pinned_ks, f"each k <= max_k={self.max_k} or -1")
        if self.draft_shape not in ("tree", "chain"):
            _fail("draft_shape", self.draft_shape, "'tree' or 'chain'")
        if self.verify_widths is not None:
            _check_int_tuple("verify_widths", self.verify_widths, 1, 1 << 16)
            w = self.verify_widths
            ok = len(w) > max(self.ks) and w[0] == 1
            ok = ok and all(w[i] >= i + 1 and w[i] >= w[i - 1] for i in range(1, len(w)))
            if not ok:
                _fail(
                    "verify_widths",
                    w,
                    f"1 at k=0, then non-decreasing with w[k] >= k + 1, for k up to {max(self.ks)}",
                )
        _check_num("prior_accept", self.prior_accept, 0.0, 1.0)
        _check_num("prior_strength", self.prior_strength, 0.0, 1e6, lo_open=True)
        _check_num("decay", self.decay, 0.0, 1.0, lo_open=True)
        _check_num("structure_sd", self.structure_sd, 0.0, 1e3, lo_open=True)
        _check_num("paired_strength", self.paired_strength, 0.0, 1e6, lo_open=True)
        if not isinstance(self.per_request, bool):
            _fail("per_request", self.per_request, "a bool")
        _check_num("request_strength", self.request_strength, 0.0, 1e6, lo_open=True)
        _check_num("request_decay", self.request_decay, 0.0, 1.0, lo_open=True)
        _check_num("level_strength", self.level_strength, 0.0, 1e6, lo_open=True)
        _check_num("level_decay", self.level_decay, 0.0, 1.0, lo_open=True)
        _check_int("max_tracked_requests", self.max_tracked_requests, 1, 1 << 24)
        _check_num("switch_margin", self.switch_margin, 0.0, 10.0)
        _check_int("switch_confirm", self.switch_confirm, 1, 1 << 20)
        _check_int("switch_patience", self.switch_patience, 1, 1 << 20)
        _check_num("tie_tolerance", self.tie_tolerance, 0.0, 0.5)
        _check_int("probe_interval", self.probe_interval, 0, 1 << 20)
        _check_int("probe_interval_thin", self.probe_interval_thin, 1, 1 << 20)
        _check_num("probe_max_loss", self.probe_max_loss, 0.0, 1.0)
        _check_int("probe_backoff", self.probe_backoff, 0, 1 << 20)
        _check_num("probe_budget", self.probe_budget, 0.0, 1.0, lo_open=True)
        _check_num("probe_budget_thin", self.probe_budget_thin, 0.0, 1.0, lo_open=True)
        _check_num("probe_budget_upshift", self.probe_budget_upshift, 0.0, 1.0, lo_open=True)
        _check_num("probe_min_evidence", self.probe_min_evidence, 0.0, 1e9)
        _check_num("probe_min_timed", self.probe_min_timed, 0.0, 1e9)
        if self.cost_preset not in PRESETS:
            _fail("cost_preset", self.cost_preset, f"one of {sorted(PRESETS)}")
        if not isinstance(self.calibrate, bool):
            _fail("calibrate", self.calibrate, "a bool")
        _check_int("cost_window", self.cost_window, 16, 1 << 20)
        _check_num("cost_decay", self.cost_decay, 0.0, 1.0, lo_open=True)
        _check_int("cost_refit_every", self.cost_refit_every, 1, 1 << 20)
        _check_num("cost_prior_weight", self.cost_prior_weight, 0.0, 1e9, lo_open=True)
        for f in fields(self):
            if f.name.startswith("cost_") and f.name[5:] in StepCostParams.__dataclass_fields__:
                value = getattr(self, f.name)
                if value is not None:
                    positive = f.name in ("cost_mem_bw", "cost_flops")
                    _check_num(f.name, value, 0.0, 1e30, lo_open=positive)

    @property
    def ks(self) -> tuple[int, ...]:
        """Sorted, de-duplicated candidates capped by ``max_k``, pinned ones included."""
        ks = {k for k in self.candidate_ks if k <= self.max_k}
        return tuple(sorted(ks | set(self.pinned().values())))

    def pinned(self) -> dict[int, int]:
        """Tier -> the ``k`` pinned there (``pinned_ks``; tiers left to the controller
        are absent)."""
        if self.pinned_ks is None:
            return {}
        return {t: k for t, k in zip(self.tiers, self.pinned_ks, strict=True) if k >= 0}

    def cost_params(self) -> StepCostParams:
        """The analytic prior: the preset with the ``cost_*`` overrides applied."""
        overrides = {
            name: getattr(self, "cost_" + name) for name in StepCostParams.__dataclass_fields__
        }
        return PRESETS[self.cost_preset].with_overrides(**overrides)

    @classmethod
    def env_var_names(cls) -> dict[str, str]:
        """Field name -> environment variable name."""
        return {f.name: "SGLANG_SPEC_EXT_ADAPTIVE_" + f.name.upper() for f in fields(cls)}
