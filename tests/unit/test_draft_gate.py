"""The SUFFIX draft gate (sglang_spec_ext/suffix/gate.py): calibration, walks, the rule."""

from __future__ import annotations

import random

import pytest

from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.suffix.gate import DraftGate, GateConfig, bs_tier, match_bucket, score_bin

#: A tree below the root: 5 -> 6 -> 7 and 5 -> 8 (node order as a drafter emits it).
TREE = DraftTree(tokens=[5, 6, 7, 8], parents=[-1, 0, 1, 0], probs=[0.9, 0.8, 0.7, 0.1],
                 score=2.5, match_len=3)  # fmt: skip


def _timed(gate: DraftGate, bs: int, t_verify: float, t_plain: float, n: int = 8) -> None:
    for _ in range(n):
        gate.on_step_time(bs, True, t_verify)
        gate.on_step_time(bs, False, t_plain)


def test_unseen_cell_trusts_the_drafters_score_and_evidence_moves_it():
    gate = DraftGate(GateConfig(prior_weight=4.0))
    assert gate.expected(TREE) == pytest.approx(2.5)
    assert gate.expected(DraftTree()) == 0.0
    assert gate.decide(["a"], [TREE])  # verified: the next commits say how many were right
    gate.on_committed("a", [5, 9])  # one draft token accepted, then the bonus
    # the cell's prior: the raw score scaled by its bucket's accepted per raw score
    prior = 2.5 * (1 + 4) / (2.5 + 4)
    assert gate.expected(TREE) == pytest.approx((1 + 4 * prior) / (1 + 4))
    for _ in range(200):
        gate.decide(["a"], [TREE])
        gate.on_committed("a", [9])  # nothing accepted, only the bonus
    assert gate.expected(TREE) < 0.1


def test_verified_count_is_commits_minus_the_bonus_capped_by_the_draft():
    gate = DraftGate()
    gate.decide(["a"], [TREE])
    gate.on_committed("a", [5, 6, 7, 1, 2, 3, 4])  # more commits than draft nodes
    (cell, (seen, accepted)), = gate._acc.items()  # fmt: skip
    assert (seen, accepted) == (1, len(TREE))
    assert cell == (match_bucket(3), score_bin(2.5))


def test_gated_draft_is_walked_over_later_commits():
    gate = DraftGate(GateConfig(cost_prior=10.0))  # a verify would have to pay 10x
    assert not gate.decide(["a"], [TREE])
    assert gate.stats()["gate_steps_plain"] == 1
    gate.on_committed("a", [5])  # a plain step commits one token: still on the path
    assert gate._acc == {} and gate.stats()["gate_walks"] == 1
    gate.decide(["a"], [TREE])  # a walk is pending: this draft is not recorded
    gate.on_committed("a", [6])
    gate.on_committed("a", [7])  # a leaf: the walk ends with 3 accepted
    assert list(gate._acc.values()) == [[1.0, 3.0]]
    assert gate.stats()["gate_walks"] == 0


def test_walk_follows_the_first_matching_child_and_stops_at_a_mismatch():
    gate = DraftGate(GateConfig(cost_prior=10.0))
    gate.decide(["a"], [TREE])
    gate.on_committed("a", [5, 8, 8])  # 5's second child, a leaf: 2 accepted
    assert list(gate._acc.values()) == [[1.0, 2.0]]
    gate.decide(["a"], [TREE])
    gate.on_committed("a", [8])  # no child of the root is 8: nothing accepted
    assert list(gate._acc.values()) == [[2.0, 2.0]]


def test_rule_is_goodput_with_measured_cost():
    gate = DraftGate(GateConfig(cost_prior=0.1, min_timings=4))
    assert gate.extra_cost(4) == pytest.approx(0.1)  # nothing timed: the prior
    _timed(gate, 4, t_verify=0.3, t_plain=0.1)
    assert gate.extra_cost(4) == pytest.approx(2.0)
    assert gate.extra_cost(3) == pytest.approx(2.0)  # same tier (3..4)
    assert gate.extra_cost(8) == pytest.approx(2.0)  # no timings there: the nearest tier's
    _timed(gate, 64, t_verify=0.5, t_plain=0.4)
    assert gate.extra_cost(64) == pytest.approx(0.25)
    assert gate.extra_cost(16) == pytest.approx(2.0) and gate.extra_cost(32) == 0.25
    weak = DraftTree(tokens=[1], parents=[-1], probs=[0.9], score=0.9, match_len=1)
    assert not gate.decide(list("abcd"), [weak] * 4)  # 3.6 expected < 4 * 2.0
    strong = DraftTree(tokens=list(range(12)), parents=list(range(-1, 11)),
                       probs=[0.9] * 12, score=10.0, match_len=20)  # fmt: skip
    assert gate.decide(list("abcd"), [strong, weak, DraftTree(), DraftTree()])
    assert not gate.decide(list("abcd"), [DraftTree()] * 4)  # nothing drafted: plain


def test_verify_cheaper_than_plain_means_no_gating():
    gate = DraftGate(GateConfig(cost_prior=5.0))
    _timed(gate, 2, t_verify=0.09, t_plain=0.1)  # e.g. a verify graph runs either way
    tiny = DraftTree(tokens=[1], parents=[-1], probs=[0.01], score=0.01, match_len=1)
    assert gate.extra_cost(2) == 0.0
    assert gate.decide(["a", "b"], [tiny, DraftTree()])


def test_forget_drops_a_request_and_state_stays_bounded():
    gate = DraftGate(GateConfig(cost_prior=10.0))
    rng = random.Random(0)
    for i in range(2000):
        rid = f"r{i}"
        gate.decide([rid], [TREE])
        gate.on_committed(rid, [rng.randrange(4, 9)])
        gate.forget(rid)
    assert not gate._walks and not gate._verified
    assert len(gate._acc) == 1  # one cell: the state is per cell, not per request


def test_tiers_and_bins():
    assert [bs_tier(b) for b in (1, 2, 3, 4, 5, 256, 10**6)] == [0, 1, 2, 2, 3, 8, 12]
    assert match_bucket(1) == 0 and match_bucket(4) == 3 and match_bucket(1000) == 9
    assert score_bin(-1) == 0 and score_bin(0.49) == 0 and score_bin(1e9) == 15


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cost_prior": -0.1},
        {"cost_prior": 101},
        {"prior_weight": 0},
        {"min_timings": 0},
        {"ema": 0.0},
    ],  # fmt: skip
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        GateConfig(**kwargs)


def test_a_buckets_evidence_calibrates_its_unseen_cells():
    """Spurious short matches: once drafts of one match length are seen to fail, a draft
    of that length in a cell never seen before is expected to fail too."""
    gate = DraftGate(GateConfig(cost_prior=10.0))
    for i in range(50):
        tree = DraftTree(tokens=[1, 2], parents=[-1, 0], probs=[1.0, 1.0], score=2.0, match_len=1)
        gate.decide([f"r{i}"], [tree])
        gate.on_committed(f"r{i}", [9])
    fresh = DraftTree(tokens=[1] * 6, parents=list(range(-1, 5)), probs=[0.9] * 6,
                      score=5.4, match_len=1)  # fmt: skip
    assert gate.expected(fresh) < 0.3
    other = DraftTree(tokens=[1] * 6, parents=list(range(-1, 5)), probs=[0.9] * 6,
                      score=5.4, match_len=20)  # fmt: skip
    assert gate.expected(other) == pytest.approx(5.4)  # another bucket: no evidence yet


def test_a_tier_the_gate_closed_verifies_one_step_in_gated_explore_every():
    """A tier whose verify steps were timed slow stays closed while its drafts stay weak,
    and its verify time would never be timed again; one drafted step in
    GATED_EXPLORE_EVERY closed in a row verifies, and once cheaper verify times come in,
    the gate opens there."""
    from sglang_spec_ext.suffix.gate import GATED_EXPLORE_EVERY

    gate = DraftGate(GateConfig(min_timings=4))
    _timed(gate, 4, t_verify=0.4, t_plain=0.1, n=4)  # r = 3
    rids = list("abcd")
    weak = DraftTree(tokens=[1, 2], parents=[-1, 0], probs=[0.9, 0.8], score=1.7, match_len=4)
    decided = [gate.decide(rids, [weak] * 4) for _ in range(2 * GATED_EXPLORE_EVERY)]
    assert [i for i, v in enumerate(decided) if v] == [
        GATED_EXPLORE_EVERY - 1,
        2 * GATED_EXPLORE_EVERY - 1,
    ]
    assert gate.steps_explored == 2 == gate.stats()["gate_steps_explored"]
    assert not gate.decide(rids, [DraftTree()] * 4)  # nothing drafted: no exploration
    for _ in range(40):  # the explored steps' times: verify costs 20% more than plain
        gate.on_step_time(4, True, 0.12)
    assert gate.decide(rids, [weak] * 4)
