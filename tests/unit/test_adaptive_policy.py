"""Tier policy: hysteresis and probing."""

from __future__ import annotations

import numpy as np

from sglang_spec_ext.adaptive.policy import TierPolicy

CANDS = [0, 1, 2, 4, 8]
NOT_THIN = np.zeros(len(CANDS), dtype=bool)


def flat_run(pol: TierPolicy, steps: int = 2000) -> list[int]:
    rng = np.random.default_rng(0)
    return [
        pol.decide(1, 1000.0 * (1 + rng.normal(0, 0.01, len(CANDS))), NOT_THIN)  # flat, 1 % noise
        for _ in range(steps)
    ]


def test_flat_objective_does_not_oscillate() -> None:
    pol = TierPolicy(CANDS, [1, 8], margin=0.03, patience=16, probe_interval=0)
    chosen = flat_run(pol)
    switches = int(np.sum(np.diff(chosen) != 0))
    assert pol.states[0].switches == switches
    assert switches <= 10, switches
    greedy = TierPolicy(CANDS, [1], margin=0.0, patience=1, confirm=1, tie=0.0, probe_interval=0)
    assert int(np.sum(np.diff(flat_run(greedy)) != 0)) > 1000  # what hysteresis prevents


def test_large_gain_switches_after_confirm_small_gain_after_patience() -> None:
    pol = TierPolicy(CANDS, [1], margin=0.05, confirm=2, patience=10, tie=0.0, probe_interval=0)
    base = np.array([100.0, 100.0, 100.0, 100.0, 100.0])
    assert pol.decide(1, base + np.array([0, 0, 1, 0, 0]), NOT_THIN) == 2  # first: argmax
    big = np.array([100.0, 100.0, 100.0, 100.0, 120.0])
    assert [pol.decide(1, big, NOT_THIN) for _ in range(2)] == [2, 8]
    small = np.array([100.0, 100.0, 100.0, 102.0, 100.0])
    picks = [pol.decide(1, small, NOT_THIN) for _ in range(10)]
    assert picks[:9] == [8] * 9 and picks[9] == 4


def test_tiers_are_independent() -> None:
    pol = TierPolicy(CANDS, [1, 8, 64], probe_interval=0)
    up = np.array([1.0, 2, 3, 4, 5])
    down = up[::-1].copy()
    assert pol.decide(2, up, NOT_THIN) == 8  # tier 1
    assert pol.decide(100, down, NOT_THIN) == 0  # tier 64
    assert pol.current_k(3) == 8 and pol.current_k(64) == 0 and pol.current_k(8) is None


def test_probes_neighbours_with_bounded_frequency() -> None:
    pol = TierPolicy(CANDS, [1], probe_interval=10, probe_interval_thin=3, probe_max_loss=0.1)
    goodput = np.array([50.0, 80.0, 100.0, 95.0, 60.0])  # current: k=2; k=4 close, k=1 far
    picks = [pol.decide(1, goodput, NOT_THIN) for _ in range(100)]
    probes = [k for k in picks if k != 2]
    assert set(probes) == {4}  # k=1 loses 20 % > 10 %: skipped; k=4 probed
    assert 4 <= len(probes) <= 6  # one probe per 10 decisions, alternating directions
    thin = np.array([False, True, False, False, False])
    picks = [pol.decide(1, goodput, thin) for _ in range(30)]
    assert picks.count(1) >= 8  # a thin neighbour is probed every 3 decisions
    assert pol.snapshot()[0]["probes"] == len(probes) + sum(k != 2 for k in picks)


def test_ties_go_to_the_widest_draft() -> None:
    pol = TierPolicy(CANDS, [1], tie=0.01, patience=4, probe_interval=0)
    nearly_flat = np.array([90.0, 100.0, 100.2, 99.6, 99.3])  # k=8 within 1 % of the best
    picks = [pol.decide(1, nearly_flat, NOT_THIN) for _ in range(6)]
    assert picks[0] == 8 and set(picks) == {8}


def test_exploration_budget_spaces_dear_probes() -> None:
    """A CPU-like tier: plain decoding (k=0) is best and one draft step takes three
    plain steps at 0.45x the goodput, so each probe of k=1 loses (1 - 0.45) x 3 = 1.65
    plain steps' worth of tokens. With a 1% budget (5% while k=1 is thin) probes are
    at least 165 (33) decisions apart; the intervals alone would probe every 16 (8)."""
    cands = [0, 1, 2]
    goodput = np.array([100.0, 45.0, 30.0])
    step_time = np.array([1.0, 3.0, 5.0])

    def run(thin: np.ndarray, budget: float, budget_thin: float, times: np.ndarray | None):
        pol = TierPolicy(
            cands, [1], probe_interval=16, probe_interval_thin=8, probe_max_loss=1.0,
            probe_budget=budget, probe_budget_thin=budget_thin,
        )  # fmt: skip
        picks = [pol.decide(1, goodput, thin, times) for _ in range(1000)]
        return sum(k != 0 for k in picks)

    known, thin = np.zeros(3, dtype=bool), np.array([False, True, False])
    assert run(known, 1.0, 1.0, step_time) == 1000 // 16  # no budget: the interval decides
    assert run(known, 0.01, 0.05, step_time) == 1000 // 165
    assert run(thin, 0.01, 0.05, step_time) == 1000 // 33
    lost = run(thin, 0.01, 0.05, step_time) * 1.65
    assert lost / 1000 <= 0.05  # the thin budget bounds what exploration loses
    # without step times a probe counts as one step long: 0.55 lost -> 55 apart
    assert run(known, 0.01, 0.05, None) == 1000 // 55
    # a cheap probe (a GPU: 0.97x goodput, 1.05x time) is never held back
    cheap = TierPolicy(cands, [1], probe_interval=16, probe_budget=0.01, probe_budget_thin=0.05)
    picks = [
        cheap.decide(1, np.array([100.0, 97.0, 90.0]), known, np.array([1.0, 1.05, 1.1]))
        for _ in range(160)
    ]
    assert sum(k != 0 for k in picks) == 10


def test_pinned_tier_keeps_its_k_and_never_probes() -> None:
    """A pinned tier returns its k whatever the predictions (no switch, no probe,
    even of a thin neighbour); the other tiers still choose."""
    pol = TierPolicy(CANDS, [1, 8], probe_interval=2, probe_interval_thin=1, pinned={8: 2})
    best_at_8 = np.array([1.0, 1.0, 1.0, 48.0, 50.0])
    all_thin = np.ones(len(CANDS), dtype=bool)
    assert {pol.decide(10, best_at_8, all_thin) for _ in range(100)} == {2}
    assert pol.states[1].probes == 0 and pol.states[1].switches == 0
    picks = [pol.decide(1, best_at_8, NOT_THIN) for _ in range(20)]
    assert picks.count(8) >= 5 and 4 in picks  # tier 1: its own choice, and probes


def test_the_upshift_rebuild_prices_probes_up_from_zero_steps_only() -> None:
    """With the draft-KV repair, a probe up from zero steps also pays the rebuild of the
    draft KV the zero steps skipped: 2 plain steps' worth here, on top of the probe's own
    0.05 x 1.05, so at a 1% budget probes are 206 decisions apart, not 16.
    A probe down from k=1 pays no rebuild."""
    cands = [0, 1, 2]
    step_time = np.array([1.0, 1.05, 1.1])
    known = np.zeros(3, dtype=bool)

    def probes(goodput: np.ndarray, upshift_s: float) -> int:
        pol = TierPolicy(cands, [1], probe_interval=16, probe_budget=0.01, probe_max_loss=1.0)
        return sum(
            k != int(np.argmax(goodput))
            for k in (pol.decide(1, goodput, known, step_time, upshift_s) for _ in range(1000))
        )

    at_zero = np.array([100.0, 95.0, 90.0])
    assert probes(at_zero, 0.0) == 1000 // 16
    assert probes(at_zero, 2.0) == 1000 // 206  # (2 + 0.0525) / 0.01 = 205.25 -> every 206th
    at_one = np.array([95.0, 100.0, 90.0])  # drafting now: nothing to rebuild
    assert probes(at_one, 2.0) == probes(at_one, 0.0)


def test_a_dear_rebuild_leaves_zero_steps_on_evidence_and_probes_by_expected_gain() -> None:
    """When leaving zero steps rebuilds more than a step's worth of skipped draft KV, the
    tier does not switch to a candidate whose acceptance is unproven (a probe finds out
    first), a probe up waits until the predicted gain over the wait covers its cost
    (at least ``probe_budget_upshift``: thin or not). A cheap rebuild changes nothing."""
    cands = [0, 1, 2]
    step_time = np.array([1.0, 1.05, 1.1])
    unproven = np.array([False, True, True])
    prior_says_up = np.array([100.0, 110.0, 90.0])

    def run(goodput, upshift_s, thin, unproven, n=300):
        pol = TierPolicy(
            cands, [64], probe_interval=16, probe_interval_thin=8, probe_budget=0.01,
            probe_budget_thin=0.05, probe_budget_upshift=0.001, probe_max_loss=1.0,
        )  # fmt: skip
        pol.states[0].current = 0
        return [pol.decide(64, goodput, thin, step_time, upshift_s, unproven) for _ in range(n)]

    picks = run(prior_says_up, 3.0, unproven, unproven)
    # no switch; probes of k=1 every max(8, 3 / 0.1) = 30 decisions
    assert picks.count(1) == 300 // 30 and set(picks) == {0, 1}
    picks = run(prior_says_up, 0.5, unproven, unproven)  # a cheap rebuild: switches
    assert picks[-100:].count(1) >= 80  # (and probes its thin neighbour k=2 from there)
    picks = run(prior_says_up, 3.0, unproven, np.zeros(3, dtype=bool))  # proven: switches
    assert picks[-100:].count(1) >= 80
    plain_best = np.array([100.0, 95.0, 90.0])
    timing_thin = np.array([False, True, True])
    known = np.zeros(3, dtype=bool)
    # predicted to lose, thin (by timing): (0.0525 + 3) / 0.001 = 3053 decisions apart
    assert run(plain_best, 3.0, timing_thin, known, n=1000).count(1) == 0
    assert run(plain_best, 0.0, timing_thin, known, n=1000).count(1) > 50  # no rebuild
