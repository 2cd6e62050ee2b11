"""HYBRID's engine-agnostic choice: chain scores, the learned gain map, the shadow ledger."""

from __future__ import annotations

import pytest

from sglang_spec_ext.hybrid.candidate import MODEL, SUFFIX, Candidate
from sglang_spec_ext.hybrid.choice import (
    GainEstimator,
    HybridChooser,
    HybridState,
    arctic_rule,
    chain_score,
    match_rule,
    max_depth,
)
from sglang_spec_ext.hybrid.ledger import ShadowLedger


def _chain(source, tokens, score, match_len=0):
    parents = tuple(range(-1, len(tokens) - 1))
    return Candidate(source, tuple(tokens), parents, score, match_len)


def test_chain_score_is_the_expected_accepted_length():
    assert chain_score([]) == 0.0
    assert chain_score([1.0, 1.0, 1.0]) == 3.0
    assert chain_score([0.5, 0.5]) == pytest.approx(0.5 + 0.25)
    with pytest.raises(ValueError, match="outside"):
        chain_score([1.5])


def test_estimator_starts_from_the_scaled_prior_and_learns_per_source():
    est = GainEstimator(prior_weight=4.0, prior_scale=0.5)
    assert est.expected(SUFFIX, 4.0) == 2.0
    for _ in range(400):
        est.observe(SUFFIX, 4.2, 1)  # over-confident source
        est.observe(MODEL, 2.1, 2)
    assert est.expected(SUFFIX, 4.0) == pytest.approx(1.0, abs=0.02)
    assert est.expected(MODEL, 2.0) == pytest.approx(2.0, abs=0.02)
    assert est.expected(MODEL, 0.1) == pytest.approx(0.05)  # an unseen bucket: the prior
    rows = est.table()[SUFFIX]
    assert rows == [{"lo": 4.0, "hi": 5.0, "seen": 400, "mean_raw": pytest.approx(4.2),
                     "mean_accepted": 1.0}]  # fmt: skip


def test_estimator_memory_lets_a_changed_workload_take_over():
    est = GainEstimator(memory=100)
    for _ in range(1000):
        est.observe(SUFFIX, 3.0, 0)
    for _ in range(300):
        est.observe(SUFFIX, 3.0, 3)
    assert est.expected(SUFFIX, 3.0) > 2.8


@pytest.mark.parametrize(
    "kwargs", [{"edges": (1.0, 0.5)}, {"prior_weight": 0}, {"prior_scale": 2}, {"memory": 0}]
)
def test_estimator_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        GainEstimator(**kwargs)


def test_baseline_rules():
    assert arctic_rule(3.0, 3) == SUFFIX and arctic_rule(2.9, 3) == MODEL
    assert match_rule(4) == SUFFIX and match_rule(3) == MODEL
    assert max_depth([-1, 0, 0, 2]) == 3 and max_depth([]) == 0


def test_chooser_policies_and_empty_drafts():
    s = _chain(SUFFIX, [1, 2, 3, 4], 3.5, match_len=6)
    m = _chain(MODEL, [1, 2, 3], 2.0)
    assert HybridChooser("arctic").choose(s, m) == SUFFIX
    assert HybridChooser("match").choose(s, m) == SUFFIX
    assert HybridChooser("model").choose(s, m) == MODEL
    learned = HybridChooser("learned")
    assert learned.choose(s, m) == SUFFIX  # priors: 1.75 > 1.0
    for _ in range(200):
        learned.estimator.observe(SUFFIX, 3.5, 0)
    assert learned.choose(s, m) == MODEL
    assert learned.choose(_chain(SUFFIX, [], 0.0), m) == MODEL
    assert learned.choose(s, _chain(MODEL, [], 0.0)) == SUFFIX
    with pytest.raises(ValueError, match="policy"):
        HybridChooser("best")


def test_ledger_resolves_winner_at_once_and_loser_when_decided():
    seen = []
    ledger = ShadowLedger(lambda *a: seen.append(a))
    ledger.add("r", 10, _chain(SUFFIX, [5, 6, 7], 2.0), won=True)
    ledger.add("r", 10, _chain(MODEL, [5, 6, 9, 9], 1.0), won=False)
    ledger.commit("r", [5, 6, 7, 8])  # suffix accepted 3 + bonus
    # The suffix draft is resolved (leaf reached); the model one too (mismatch at 3rd).
    assert seen == [(SUFFIX, 2.0, 3, True), (MODEL, 1.0, 2, False)]
    seen.clear()
    ledger.add("r", 14, _chain(MODEL, [1, 2, 3], 1.5), won=True)
    ledger.add("r", 14, _chain(SUFFIX, [1, 2, 3, 4, 5, 6], 4.0), won=False)
    ledger.commit("r", [1, 2, 3, 4])  # model: all 3 + bonus; suffix still matching
    assert seen == [(MODEL, 1.5, 3, True)]
    ledger.add("r", 18, _chain(MODEL, [5, 0], 1.0), won=True)
    ledger.commit("r", [5, 6])  # suffix: 5, 6 match too -> 6 accepted, leaf
    assert seen[1:] == [(SUFFIX, 4.0, 6, False), (MODEL, 1.0, 1, True)]
    assert ledger.dropped == 0


def test_ledger_is_bounded_and_forgets_finished_requests():
    ledger = ShadowLedger(lambda *a: None, max_pending=2, max_requests=2)
    for _ in range(3):
        ledger.add("a", 0, _chain(SUFFIX, [1, 2, 3], 1.0), won=False)
    assert ledger.dropped == 1
    ledger.add("b", 0, _chain(SUFFIX, [1], 1.0), won=False)
    ledger.add("c", 0, _chain(SUFFIX, [1], 1.0), won=False)  # evicts "a" (2 pending)
    assert len(ledger) == 2 and ledger.dropped == 3
    ledger.finish("b")
    assert len(ledger) == 1 and ledger.dropped == 4
    ledger.commit("zzz", [1, 2])  # unknown request: nothing to do
    with pytest.raises(ValueError, match="outside"):
        ledger.add("c", 5, _chain(SUFFIX, [1], 1.0), won=False)


def test_state_learns_from_losing_drafts_and_reports_shares():
    """The model is right every step and the suffix never, though its raw score is
    high: after a few steps the learned rule prefers the model; both sources were
    observed although only one was verified per step."""
    state = HybridState("learned")
    committed = 0
    winners = []
    for step in range(60):
        truth = [step * 10 + j for j in range(4)]
        s = _chain(SUFFIX, [7, 7, 7], 3.0)
        m = _chain(MODEL, truth[:3], 1.0)
        w = state.choose("r", committed, s, m)
        winners.append(w)
        accepted = 3 if w == MODEL else 0
        toks = truth[: accepted + 1]
        state.verified("r", w, accepted, toks)
        committed += len(toks)
    assert winners[0] == SUFFIX and set(winners[-20:]) == {MODEL}
    summary = state.summary()
    by = summary["by_source"]
    assert by[MODEL]["steps"] + by[SUFFIX]["steps"] == 60
    assert by[MODEL]["accept_len"] == 4.0 and by[SUFFIX]["accept_len"] == 1.0
    assert state.estimator.table()[SUFFIX][0]["mean_accepted"] == 0.0
    state.finish("r")
    assert summary["pending_requests"] == 1 and len(state.ledger) == 0


def test_max_expected_bounds_expected_over_every_lower_score():
    est = GainEstimator()
    for score, accepted in ((0.2, 3), (0.9, 0), (1.6, 1), (2.5, 2)):
        for _ in range(20):
            est.observe(MODEL, score, accepted)
    for up_to in (0.0, 0.3, 1.0, 1.7, 2.9, 3.0):
        grid = [up_to * i / 400 for i in range(401)]
        brute = max(est.expected(MODEL, x) for x in grid)
        assert est.max_expected(MODEL, up_to) >= brute - 1e-9, up_to
        assert est.max_expected(MODEL, up_to) <= brute + 1e-3, up_to  # the sup of a bucket
    # the low bucket's evidence (3 accepted) counts for a higher bound
    assert est.max_expected(MODEL, 2.9) > est.expected(MODEL, 2.9)


def test_suffix_wins_before_the_model_drafts_only_if_it_wins_whatever_the_model_drafts():
    """The pre-draft decision never disagrees with choose() on any model draft the model
    could make after a first token of that probability."""
    import itertools

    steps = 3
    s = _chain(SUFFIX, [1, 2, 3], 1.2, match_len=5)
    learned = HybridChooser("learned")
    for score in (0.3, 1.0, 2.0, 2.9):
        for _ in range(30):
            learned.estimator.observe(MODEL, score, 1)
            learned.estimator.observe(SUFFIX, score, 2)
    grid = (0.05, 0.3, 0.6, 0.9, 1.0)
    for first in grid:
        early = learned.suffix_wins_before_model_drafts(s, first, steps)
        for rest in itertools.product(grid, repeat=steps - 1):
            m = _chain(MODEL, [7, 8, 9], chain_score([first, *rest]))
            if early:
                assert learned.choose(s, m) == SUFFIX, (first, rest)
    assert learned.suffix_wins_before_model_drafts(s, 0.05, steps)  # a weak model start
    strong = _chain(SUFFIX, [1], 0.01)
    assert not learned.suffix_wins_before_model_drafts(strong, 0.05, steps)
    assert not learned.suffix_wins_before_model_drafts(_chain(SUFFIX, [], 0.0), 0.0, steps)
    assert HybridChooser("suffix").suffix_wins_before_model_drafts(_chain(SUFFIX, [], 0.0), 1, 3)
    assert not HybridChooser("model").suffix_wins_before_model_drafts(s, 0.0, steps)
    assert HybridChooser("arctic").suffix_wins_before_model_drafts(_chain(SUFFIX, [1], 3.0), 1, 3)
    assert not HybridChooser("arctic").suffix_wins_before_model_drafts(s, 0.0, steps)
    assert HybridChooser("match").suffix_wins_before_model_drafts(s, 1.0, steps)


def test_taking_the_suffix_draft_ledgers_only_it():
    state = HybridState("learned")
    s = _chain(SUFFIX, [5, 6], 1.0)
    assert state.take_suffix("r", 0, s) == SUFFIX
    state.ledger.commit("r", [5, 6, 9])
    assert [(b["seen"], b["mean_accepted"]) for b in state.estimator.table()[SUFFIX]] == [(1, 2)]
    assert MODEL not in state.estimator.table()
