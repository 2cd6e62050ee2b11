"""AdaptiveController: end-to-end choices on known acceptance and costs; config."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sglang_spec_ext.adaptive import AdaptiveConfig, AdaptiveController
from sglang_spec_ext.adaptive.prior import StepCostParams, analytic_step_time

TRUTH = StepCostParams().coefficients()


def drive(ctl: AdaptiveController, bs: int, p: float, steps: int, seed: int = 0) -> list[int]:
    """Chain acceptance p per depth, true analytic step times with 5 % noise."""
    rng = np.random.default_rng(seed)
    chosen = []
    for _ in range(steps):
        k = ctl.choose_k(bs)
        chosen.append(k)
        ok = rng.random((bs, max(k, 1)))[:, :k] < p
        acc = np.where(ok.all(axis=1), k, np.argmin(ok, axis=1)) if k else np.zeros(bs, int)
        t = analytic_step_time(TRUTH, bs, k)[0] * np.exp(rng.normal(0, 0.05))
        ctl.on_verify(bs, k, acc, t)
    return chosen


def test_zero_acceptance_turns_speculation_off() -> None:
    ctl = AdaptiveController()
    chosen = drive(ctl, 1, 0.0, 300)
    assert ctl.policy.current_k(1) == 0
    assert chosen[-100:].count(0) >= 85  # the rest: probes, at most 1 in probe_interval_thin


def test_high_acceptance_at_bs1_uses_long_drafts() -> None:
    ctl = AdaptiveController()
    drive(ctl, 1, 0.95, 300)
    assert ctl.policy.current_k(1) >= 16


def test_large_batch_uses_short_drafts() -> None:
    ctl = AdaptiveController()
    drive(ctl, 256, 0.7, 200)
    k = ctl.policy.current_k(256)
    assert k is not None and 1 <= k <= 4


def test_batch_size_tiers_choose_differently() -> None:
    ctl = AdaptiveController()
    for _ in range(3):
        drive(ctl, 1, 0.8, 100)
        drive(ctl, 256, 0.8, 100)
    assert ctl.policy.current_k(1) > ctl.policy.current_k(256)


def test_per_request_ids_and_snapshot() -> None:
    ctl = AdaptiveController(AdaptiveConfig(max_k=8))
    assert max(ctl.ks) == 8
    for _ in range(50):
        k = ctl.choose_k(2, ["a", "b"])
        ctl.on_verify(2, k, [k, 0], 0.01, ["a", "b"], accepted_within={1: [1, 0]})
    e = ctl.requests.expected_accept_lengths(["a", "b"], [8])[:, 0]
    assert e[0] > e[1]
    ctl.forget_requests(["a"])
    snap = ctl.snapshot()
    json.dumps(snap)
    assert snap["steps"] == 50 and snap["tracked_requests"] == 1
    assert {"tiers", "expected_accept_length", "cost", "last_decision"} <= set(snap)
    with pytest.raises(ValueError, match="req_ids"):
        ctl.on_verify(2, 1, [1, 0], None, ["a"])


def test_input_validation() -> None:
    ctl = AdaptiveController()
    with pytest.raises(ValueError, match="batch_size"):
        ctl.choose_k(0)
    with pytest.raises(ValueError, match="k="):
        ctl.on_verify(1, -1, [0])


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [
        ("decay", 0.0, r"decay=0.0: expected a number in \(0.0, 1.0\]"),
        ("max_k", -1, r"max_k=-1: expected an integer in \[0, 1024\]"),
        ("candidate_ks", (), "candidate_ks=()"),
        ("candidate_ks", (64,), "at least one value <= max_k=32"),
        ("tiers", (0, 1), r"tiers=\(0, 1\)"),
        ("cost_preset", "nope", "cost_preset='nope': expected one of"),
        ("cost_mem_bw", 0.0, "cost_mem_bw=0.0"),
        ("per_request", 1, "per_request=1: expected a bool"),
        ("switch_patience", 0, "switch_patience=0"),
    ],
)
def test_config_validation_names_field_value_and_range(
    field: str, value: object, expect: str
) -> None:
    with pytest.raises(ValueError, match=expect):
        AdaptiveConfig(**{field: value})


def test_config_helpers() -> None:
    cfg = AdaptiveConfig(candidate_ks=(16, 0, 4, 64, 4), max_k=16, cost_fixed_s=5e-3)
    assert cfg.ks == (0, 4, 16)
    assert cfg.cost_params().fixed_s == 5e-3
    names = AdaptiveConfig.env_var_names()
    assert names["switch_margin"] == "SGLANG_SPEC_EXT_ADAPTIVE_SWITCH_MARGIN"
    assert all(v.startswith("SGLANG_SPEC_EXT_ADAPTIVE_") for v in names.values())


def test_expected_repairs_count_unwritten_tokens_and_learn_their_cost() -> None:
    """With the draft-KV repair, the controller counts the tokens zero steps leave
    without draft KV (batch size per zero step, reset by a drafting step), prices a
    probe up from zero with the prior's time for rebuilding them, and learns a scale on
    that prior from measured repairs."""
    ctl = AdaptiveController(AdaptiveConfig(candidate_ks=(0, 1, 2), max_k=2))
    ctl.observe_repair(100, 4, 1.0)  # no repair expected: ignored
    assert ctl.predicted_repair_s() == 0.0

    def prior(tokens: int, requests: int) -> float:
        return 1e-3 + 1e-5 * tokens  # a fixed part (weights) and a part per token

    ctl.expect_repairs(prior)
    seen: list[float] = []

    def decide(k: int):
        return lambda *a, upshift_s=0.0, **kw: seen.append(upshift_s) or k

    ctl.policy.decide = decide(0)  # type: ignore[method-assign]
    for _ in range(3):
        ctl.choose_k(64)
    assert seen == pytest.approx([0.0, prior(64, 64), prior(128, 64)])
    ctl.policy.decide = decide(1)  # type: ignore[method-assign]
    ctl.choose_k(64)  # the drafting step rebuilds them
    ctl.choose_k(64)
    assert seen[-1] == 0.0
    ctl.observe_repair(1000, 8, 2 * prior(1000, 8))  # twice the prior: moves 20% of the way
    assert ctl.repair_scale == pytest.approx(1.2)
    ctl.observe_repair(0, 0, 1.0)  # nothing rebuilt: ignored
    ctl.observe_repair(10, 1, -1.0)  # faster than predicted by the step model: free
    assert ctl.repair_scale == pytest.approx(0.96)
    ctl.policy.decide = decide(0)  # type: ignore[method-assign]
    ctl.choose_k(16)
    assert ctl.predicted_repair_s() == pytest.approx(0.96 * prior(16, 16))
    # the engine's own count (finished requests took their tokens along) replaces it
    ctl.note_unwritten(500, 3)
    assert ctl.predicted_repair_s() == pytest.approx(0.96 * prior(500, 3))
    ctl.choose_k(16)
    assert seen[-1] == pytest.approx(0.96 * prior(500, 3))


def test_leaving_zero_steps_is_gated_on_acceptance_evidence() -> None:
    """The policy is told which candidates' acceptance still rests on the prior (chain
    trials per depth under ``probe_min_evidence``); zero steps never are."""
    cfg = AdaptiveConfig(candidate_ks=(0, 1, 2), max_k=2, draft_shape="chain")
    ctl = AdaptiveController(cfg)
    seen = []
    ctl.policy.decide = lambda *a, unproven=None, **kw: seen.append(unproven) or 1
    ctl.choose_k(8)
    assert seen[-1].tolist() == [False, True, True]
    for _ in range(5):  # 40 trials at depth 1, 40 x 0.5 at depth 2
        ctl.on_verify(8, 2, [0, 1] * 4)
    ctl.choose_k(8)
    assert seen[-1].tolist() == [False, False, True]
