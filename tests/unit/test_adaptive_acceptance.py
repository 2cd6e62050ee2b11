"""Acceptance estimator: convergence, drift, budgets, levels."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_spec_ext.adaptive.acceptance import (
    AcceptanceEstimator,
    LevelTracker,
    accepted_within_budgets,
)

KS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]


def chain(rng: np.random.Generator, p: float, k: int, n: int) -> np.ndarray:
    """Accepted drafts of a chain with per-depth acceptance p, capped at k."""
    ok = rng.random((n, k)) < p
    return np.where(ok.all(axis=1), k, np.argmin(ok, axis=1))


def chain_len(p: float, k: int) -> float:
    return 1.0 + sum(p**d for d in range(1, k + 1))


def test_converges_to_known_chain_rates() -> None:
    rng = np.random.default_rng(0)
    est = AcceptanceEstimator(KS, decay=0.999)
    for _ in range(400):
        est.observe(8, chain(rng, 0.8, 8, 16))
    cond = est.conditionals()[est.bucket_index(8), 1:9]
    assert np.allclose(cond, 0.8, atol=0.03)
    e = est.expected_accept_lengths([0, 8])
    assert e[0] == 1.0
    assert abs(e[1] - chain_len(0.8, 8)) / chain_len(0.8, 8) < 0.03


def test_every_observed_budget_matches_its_mean() -> None:
    rng = np.random.default_rng(1)
    est = AcceptanceEstimator(KS, decay=0.9995)
    truth = {}
    for k, p in ((2, 0.5), (8, 0.7), (24, 0.75)):  # a tree: wider budgets accept more
        truth[k] = chain_len(p, k)
    for _ in range(300):
        for k, p in ((2, 0.5), (8, 0.7), (24, 0.75)):
            est.observe(k, chain(rng, p, k, 8))
    got = est.expected_accept_lengths(list(truth))
    for (k, want), g in zip(truth.items(), got, strict=True):
        assert abs(g - want) / want < 0.04, (k, g, want)


def test_forgetting_tracks_drift() -> None:
    rng = np.random.default_rng(2)
    est = AcceptanceEstimator(KS, decay=0.99)
    for _ in range(300):
        est.observe(4, chain(rng, 0.9, 4, 8))
    high = est.expected_accept_lengths([4])[0]
    for _ in range(600):
        est.observe(4, chain(rng, 0.3, 4, 8))
    low = est.expected_accept_lengths([4])[0]
    assert abs(high - chain_len(0.9, 4)) < 0.15
    assert abs(low - chain_len(0.3, 4)) < 0.1


def test_unobserved_budgets_extrapolate_upwards_and_stay_monotone() -> None:
    rng = np.random.default_rng(3)
    est = AcceptanceEstimator(KS)
    for _ in range(200):
        est.observe(4, chain(rng, 0.9, 4, 4))
    e = est.expected_accept_lengths(KS)
    assert np.all(np.diff(e) >= -1e-12)
    assert e[KS.index(8)] > e[KS.index(4)] + 0.2  # optimism about longer drafts
    assert np.all(e <= np.array(KS) + 1)


def test_no_data_gives_the_prior_chain() -> None:
    est = AcceptanceEstimator(KS, prior_mean=0.5)
    assert abs(est.expected_accept_lengths([4])[0] - chain_len(0.5, 4)) < 1e-9


def test_counterfactual_counts_feed_smaller_buckets() -> None:
    est = AcceptanceEstimator(KS)
    est.observe(8, [8, 8], within={4: [4, 4], 2: [2, 2], 5: [5, 5]})
    ev = est.evidence()
    assert ev[est.bucket_index(8)] > 0 and ev[est.bucket_index(4)] > 0
    assert ev[est.bucket_index(2)] > 0 and ev[est.bucket_index(6)] == 0


def test_accepted_within_budgets() -> None:
    # accepted path = nodes with best-first ranks 0, 1, 5, 9
    assert accepted_within_budgets([0, 1, 5, 9], [1, 2, 5, 6, 10, 32]) == [1, 2, 2, 3, 4, 4]
    assert accepted_within_budgets([], [1, 8]) == [0, 0]


def test_levels_scale_requests() -> None:
    rng = np.random.default_rng(4)
    est = AcceptanceEstimator(KS)
    lv = LevelTracker(est, strength=4.0)
    for _ in range(200):
        hi, lo = chain(rng, 0.95, 8, 1)[0], chain(rng, 0.3, 8, 1)[0]
        levels = lv.levels(["hi", "lo"])
        lv.observe(8, ["hi", "lo"], [hi, lo])
        est.observe(8, [hi, lo], levels=levels)
    levels = lv.levels(["hi", "lo", "new"])
    assert levels[0] > 1.5 > 0.7 > levels[1]
    assert levels[2] == 1.0
    e = lv.expected_accept_lengths(["hi", "lo"], [8])[:, 0]
    assert abs(e[0] - chain_len(0.95, 8)) < 0.8 and abs(e[1] - chain_len(0.3, 8)) < 0.3
    lv.forget(["hi"])
    assert lv.levels(["hi"])[0] == 1.0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(KS), st.lists(st.integers(0, 40), min_size=1, max_size=6)),
        max_size=30,
    )
)
def test_expected_lengths_are_monotone_and_bounded(steps: list) -> None:
    est = AcceptanceEstimator(KS)
    for k, acc in steps:
        est.observe(k, acc)
    ks = np.arange(0, 40)
    e = est.expected_accept_lengths(ks)
    assert e[0] == 1.0
    assert np.all(np.diff(e) >= -1e-9)
    assert np.all(e >= 1.0) and np.all(e <= ks + 1 + 1e-9)
