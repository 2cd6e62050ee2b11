"""Per-request verify lengths for goodput (sglang_spec_ext/suffix/lengths.py) and the draft
gate's ragged mode (DraftGate.trim)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.suffix.gate import DraftGate, GateConfig
from sglang_spec_ext.suffix.lengths import (
    MIN_STEPS,
    NodeCalibration,
    VerifyCost,
    _subtree,
    best_count,
    trim_trees,
)


def _chain(probs: list[float], match_len: int = 8) -> DraftTree:
    n = len(probs)
    return DraftTree(tokens=list(range(10, 10 + n)), parents=list(range(-1, n - 1)),
                     probs=probs, score=sum(probs), match_len=match_len)  # fmt: skip


SAME = lambda p, _match_len: p  # noqa: E731 - the drafter's probabilities as they are


def _throughput(bs: int, chosen: list[float], t0: float, b: float) -> float:
    return (bs + sum(chosen)) / (t0 + b * len(chosen))


@pytest.mark.parametrize("seed", range(20))
def test_best_count_is_the_best_subset(seed):
    rng = random.Random(seed)
    probs = sorted((rng.random() for _ in range(7)), reverse=True)
    bs, t0, b = rng.randint(1, 8), 1.0, rng.uniform(0.01, 1.0)
    best = max(
        (c for r in range(len(probs) + 1) for c in itertools.combinations(probs, r)),
        key=lambda c: _throughput(bs, list(c), t0, b),
    )
    k = best_count(np.array(probs), bs, t0, b)
    assert _throughput(bs, probs[:k], t0, b) == pytest.approx(_throughput(bs, list(best), t0, b))


def test_a_verify_steps_fixed_cost_must_be_earned_first():
    probs = np.array([0.6, 0.5])
    assert best_count(probs, 4, t0=1.0, b=0.01) == 2
    assert best_count(probs, 4, t0=1.0, b=0.01, e=0.5) == 0  # 5.1 / 1.52 < 4 / 1


def test_cheap_verify_keeps_everything_dear_verify_nothing():
    trees = [_chain([0.9, 0.8, 0.5, 0.1]), _chain([0.3, 0.2]), DraftTree()]
    cheap = trim_trees(trees, SAME, t0=1.0, b=1e-4)
    assert [len(t) for t in cheap] == [4, 2, 0]
    dear = trim_trees(trees, SAME, t0=1.0, b=10.0)
    assert [len(t) for t in dear] == [0, 0, 0]
    # In between: the likely nodes of the first draft only (ragged lengths).
    # (3 tokens per plain step; a node pays while p > 0.1 x the tokens per unit time so
    # far: 0.9, 0.8 and 0.5 do, then 0.3 < 0.1 x 4.0.)
    mid = trim_trees(trees, SAME, t0=1.0, b=0.1)
    assert [len(t) for t in mid] == [3, 0, 0]
    assert mid[0].tokens == [10, 11, 12] and mid[0].parents == [-1, 0, 1]


def test_calibration_moves_the_cut():
    trees = [_chain([0.5, 0.4])]
    # Halved, both nodes fall below what the step costs; doubled (capped at 1) both pay.
    assert len(trim_trees(trees, lambda p, _m: p * 0.4, t0=1.0, b=0.5)[0]) == 0
    assert len(trim_trees(trees, lambda p, _m: p * 2.0, t0=1.0, b=0.5)[0]) == 2


def test_node_calibration_labels_what_the_committed_tokens_decide():
    cal = NodeCalibration(prior_weight=2.0)
    # root -> 10 (p .9) -> 11 (p .85) -> 12 (p .8); root -> 20 (p .1) -> 21 (p .05)
    tree = DraftTree(tokens=[10, 11, 12, 20, 21], parents=[-1, 0, 1, -1, 3],
                     probs=[0.9, 0.85, 0.8, 0.1, 0.05], score=2.7, match_len=5)  # fmt: skip
    # The target committed 10 then 99 (node 11 rejected): 10 on the path; 11, 20 off it;
    # 21 below an off-path node; 12 below 11 (rejected) is off too.
    assert cal.observe(tree, [10, 99]) == 5
    assert cal.seen.sum() == 5 and cal.hits.sum() == 1
    assert cal.hits[9] == 1 and cal.seen[8] == 2  # 0.9 accepted; 0.85 and 0.8 not
    # Only the first token known: 11 and 12 stay unknown (their parent is on the path).
    cal2 = NodeCalibration()
    assert cal2.observe(tree, [10]) == 3
    # Calibrated: the 0.8-0.9 bin saw 0 of 2, pulled from 0.85 towards 0.
    assert cal.calibrate(np.array([0.85]))[0] == pytest.approx(2 * 0.85 / 4)
    assert cal.stats()["lengths_node_acceptance_by_prob_bin"][9] == 1.0
    # Per match-length cell: this draft's bucket (match 5) has the 0.9 node's hit, so a
    # 0.9 node of a match-5 draft is likelier than one of an unseen bucket's.
    assert cal.calibrate(np.array([0.9]), 5)[0] > cal.calibrate(np.array([0.9]), 40)[0]


def test_subtree_keeps_only_nodes_whose_ancestors_are_kept():
    tree = DraftTree(tokens=[1, 2, 3, 4, 5], parents=[-1, 0, -1, 2, 1],
                     probs=[0.9, 0.5, 0.4, 0.3, 0.2], score=2.3, match_len=4)  # fmt: skip
    cut = _subtree(tree, np.array([True, False, True, True, True]))  # node 4's parent is cut
    assert cut.tokens == [1, 3, 4] and cut.parents == [-1, -1, 1]
    assert cut.score == pytest.approx(0.9 + 0.4 + 0.3)


def test_trim_never_keeps_a_node_without_its_parent():
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(1, 12)
        parents = [rng.randint(-1, i - 1) for i in range(n)]
        probs = []
        for p in parents:  # path probabilities: never above the parent's
            probs.append(rng.random() * (1.0 if p < 0 else probs[p]))
        tree = DraftTree(tokens=list(range(n)), parents=parents, probs=probs,
                         score=sum(probs), match_len=3)  # fmt: skip
        scale = rng.uniform(0.5, 2)
        cut = trim_trees([tree], lambda p, _m, s=scale: p * s, 1.0, rng.uniform(0.01, 0.5))[0]
        assert all(-1 <= p < i for i, p in enumerate(cut.parents))
        assert len(cut) <= n


def test_verify_cost_fit_recovers_the_step_model():
    cost = VerifyCost(cost_prior=0.1)
    # Before any timing: the prior, in plain-step units: a full-width verify = 1.1 plain.
    t0, e, b = cost.step_costs(4, 16)
    assert t0 == 1.0 and e == 0.0 and b * 4 * 15 == pytest.approx(0.1)
    rng = random.Random(0)
    for _ in range(MIN_STEPS * 4):
        bs, drafts = rng.randint(1, 16), rng.choice([0, rng.randint(1, 60)])
        cost.on_step(bs, drafts, 0.010 + 0.002 * bs + (0.003 if drafts else 0) + 0.0005 * drafts)
    t0, e, b = cost.step_costs(8, 16)
    assert t0 == pytest.approx(0.010 + 0.016) and b == pytest.approx(0.0005)
    assert e == pytest.approx(0.003)
    assert cost.stats()["lengths_cost_steps"] == MIN_STEPS * 4


def test_verify_cost_keeps_the_prior_while_drafts_never_vary():
    cost = VerifyCost(cost_prior=0.2)
    for _ in range(MIN_STEPS * 2):
        cost.on_step(4, 0, 0.01)
    assert cost.step_costs(4, 8) == (1.0, 0.0, pytest.approx(0.2 / 28))
    assert len(cost._steps) <= cost.window


def test_gate_trim_learns_node_acceptance_from_commits():
    gate = DraftGate(GateConfig(cost_prior=0.1))
    tree = _chain([0.9, 0.9, 0.9, 0.9], match_len=8)
    cut = gate.trim(["r"], [tree], width=8)[0]
    assert len(cut) == 4  # the prior prices a node at 0.1 / 7 of a plain step
    # The request commits 2 of the 4 drafted tokens and the bonus: 2 hits, 2 misses.
    gate.on_committed("r", [10, 11, 99])
    assert gate.nodes.seen[9] == 4 and gate.nodes.hits[9] == 2
    assert gate.nodes.calibrate(np.array([0.9]))[0] == pytest.approx((2 + 1.8) / 6)
    stats = gate.stats()
    assert stats["lengths_nodes_drafted"] == 4 and stats["lengths_nodes_verified"] == 4
    gate.forget("r")
    assert not gate._drafts


def test_gate_trim_to_nothing_walks_the_draft():
    gate = DraftGate(GateConfig(cost_prior=100.0))  # a verify that never pays
    tree = _chain([0.5, 0.4])
    assert len(gate.trim(["r"], [tree], width=8)[0]) == 0
    assert gate.steps_gated == 1 and "r" in gate._walks
