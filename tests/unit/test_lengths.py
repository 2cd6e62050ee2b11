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
    RealisedRatio,
    VerifyCost,
    _subtree,
    best_count,
    trim_trees,
)
from sglang_spec_ext.suffix.node_calibration import NodeCalibration, conditional_probs


def _chain(probs: list[float], match_len: int = 8) -> DraftTree:
    n = len(probs)
    return DraftTree(tokens=list(range(10, 10 + n)), parents=list(range(-1, n - 1)),
                     probs=probs, score=sum(probs), match_len=match_len)  # fmt: skip


def SAME(trees):  # noqa: N802 - the drafter's probabilities as they are, per tree
    return [np.asarray(t.probs) for t in trees]


def _scaled(s: float):
    return lambda trees: [np.asarray(t.probs) * s for t in trees]


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
    cheap = trim_trees(trees, SAME, t0=1.0, b=1e-4)[0]
    assert [len(t) for t in cheap] == [4, 2, 0]
    dear = trim_trees(trees, SAME, t0=1.0, b=10.0)[0]
    assert [len(t) for t in dear] == [0, 0, 0]
    # In between: the likely nodes of the first draft only (ragged lengths).
    # (3 tokens per plain step; a node pays while p > 0.1 x the tokens per unit time so
    # far: 0.9, 0.8 and 0.5 do, then 0.3 < 0.1 x 4.0.)
    mid = trim_trees(trees, SAME, t0=1.0, b=0.1)[0]
    assert [len(t) for t in mid] == [3, 0, 0]
    assert mid[0].tokens == [10, 11, 12] and mid[0].parents == [-1, 0, 1]


def test_calibration_moves_the_cut():
    trees = [_chain([0.5, 0.4])]
    # Halved, both nodes fall below what the step costs; doubled (capped at 1) both pay.
    assert len(trim_trees(trees, _scaled(0.4), t0=1.0, b=0.5)[0][0]) == 0
    assert len(trim_trees(trees, _scaled(2.0), t0=1.0, b=0.5)[0][0]) == 2


def test_node_calibration_learns_acceptance_given_the_parent():
    cal = NodeCalibration(prior_weight=2.0)
    # root -> 10 (p .9) -> 11 (p .85) -> 12 (p .8); root -> 20 (p .1) -> 21 (p .05)
    tree = DraftTree(tokens=[10, 11, 12, 20, 21], parents=[-1, 0, 1, -1, 3],
                     probs=[0.9, 0.85, 0.8, 0.1, 0.05], score=2.7, match_len=5)  # fmt: skip
    assert conditional_probs(tree) == pytest.approx([0.9, 0.85 / 0.9, 0.8 / 0.85, 0.1, 0.5])
    # The target committed 10 then 99: 10 accepted (its parent, the root, is on the path),
    # 11 rejected (parent 10 on the path), 20 rejected; 12 and 21 have rejected parents:
    # no observation of their conditional.
    assert cal.observe(tree, [10, 99]) == 3
    assert cal.seen.sum() == 3 and cal.hits.sum() == 1
    # Only the first token known: 10 and 20 observed; 11 (parent on the path) undecided.
    assert NodeCalibration().observe(tree, [10]) == 2
    # Calibrated acceptance is a product along the path, never above the parent's.
    p = cal.calibrate(tree)
    assert all(p[i] <= p[par] for i, par in enumerate(tree.parents) if par >= 0)
    # Bin 0.9-1 saw 1 of 2 (pooled, with the prior: (1 + 2 x 0.9) / 4 = 0.7); the match-5
    # cell saw the same 1 of 2 on top of that prior: (1 + 2 x 0.7) / 4 = 0.6; another
    # bucket keeps the pooled rate.
    fresh = DraftTree(tokens=[10], parents=[-1], probs=[0.9], score=0.9, match_len=40)
    same_bucket = DraftTree(tokens=[10], parents=[-1], probs=[0.9], score=0.9, match_len=5)
    assert cal.calibrate(fresh)[0] == pytest.approx(0.7)
    assert cal.calibrate(same_bucket)[0] == pytest.approx(0.6)
    assert cal.stats()["lengths_conditional_acceptance_by_prob_bin"][9] == 0.5


def test_what_shallow_nodes_teach_reaches_deep_ones():
    """A long repeated match: its first nodes keep being accepted, so a deep node of the
    same conditional probability is rated high although no cut draft ever showed it."""
    cal = NodeCalibration()
    chain = _chain([0.5 ** (i + 1) for i in range(8)], match_len=40)  # conditionals 0.5
    before = cal.calibrate(chain)[-1]
    for _ in range(30):  # the first two nodes verified and accepted, the bonus matches too
        cal.observe(_subtree(chain, np.array([True, True] + [False] * 6)), [10, 11, 12])
    after = cal.calibrate(chain)
    assert after[-1] > 100 * before and after[-1] > 0.5


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
        cut = trim_trees([tree], _scaled(scale), 1.0, rng.uniform(0.01, 0.5))[0][0]
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
    # Conditionals 0.9, 1, 1, 1: node 1 (bin 9) accepted; node 2 (bin 9) accepted; node 3
    # rejected; node 4's parent rejected: no observation.
    assert gate.nodes.seen[9] == 3 and gate.nodes.hits[9] == 2
    stats = gate.stats()
    assert stats["lengths_nodes_drafted"] == 4 and stats["lengths_nodes_verified"] == 4
    gate.forget("r")
    assert not gate._drafts


def test_gate_trim_to_nothing_walks_the_draft():
    gate = DraftGate(GateConfig(cost_prior=100.0))  # a verify that never pays
    tree = _chain([0.5, 0.4])
    assert len(gate.trim(["r"], [tree], width=8)[0]) == 0
    assert gate.steps_gated == 1 and "r" in gate._walks


def _cpu_smollm2_roofline():
    from sglang_spec_ext.adaptive.prior import PRESETS, ModelSizes, sized_prior

    return sized_prior(PRESETS["llama3-8b-h100"], ModelSizes("cpu", 1.35e8, 5.4e8, 46080.0))


def test_roofline_prior_prices_a_node_by_the_device():
    """A CPU's verify is compute-bound at once: a draft node costs most of a request's
    share of a plain step; an H100's memory-bound decode takes nodes nearly free."""
    from sglang_spec_ext.adaptive.prior import PRESETS, ragged_step_costs

    for bs in (16, 64):
        t0, e, b = ragged_step_costs(_cpu_smollm2_roofline(), bs, 16)
        assert 0 < e < t0 and 0.5 < b / (t0 / bs) <= 1.0
        t0, e, b = ragged_step_costs(PRESETS["llama3-8b-h100"], bs, 16)
        assert 0 < e < t0 and b / (t0 / bs) < 0.1
    cost = VerifyCost(cost_prior=0.1, roofline=_cpu_smollm2_roofline())
    assert cost.step_costs(64, 16) == ragged_step_costs(cost.roofline, 64, 16)
    assert not cost.fitted and cost.stats()["lengths_prior_steps"] == 1


def test_a_pessimistic_prior_still_explores_until_the_fit_takes_over():
    """Under a CPU roofline a bs-64 batch of likely (0.9) drafts never pays for its
    nodes, so without exploration the fit would never see a verify step. One prior-priced
    step in EXPLORE_EVERY verifies at a discount; once the fit holds plain and verify
    steps it prices every step (here: nodes nearly free, so every step verifies)."""
    from sglang_spec_ext.suffix.gate import EXPLORE_EVERY

    gate = DraftGate(GateConfig(), roofline=_cpu_smollm2_roofline())
    rids = [f"r{i}" for i in range(64)]
    verified_steps = []
    for _step in range(MIN_STEPS + EXPLORE_EVERY):
        trees = [_chain([0.9, 0.8, 0.7], match_len=4) for _ in rids]
        cut = gate.trim(rids, trees, width=16)
        d = sum(len(t) for t in cut)
        verified_steps.append(d > 0)
        gate.on_step_time(64, d > 0, 0.3 + (0.01 + 0.0001 * d if d else 0.0), d)
    assert gate.explored >= 1 and sum(verified_steps) == gate.explored
    assert all(verified_steps[i] == ((i + 1) % EXPLORE_EVERY == 0) for i in range(MIN_STEPS))
    gate.cost.on_step(64, 7, 0.3107)  # a second verify size: the fit is identified
    assert gate.cost.fitted
    cut = gate.trim(rids, [_chain([0.9, 0.8, 0.7], match_len=4) for _ in rids], width=16)
    assert (
        sum(len(t) for t in cut) == 3 * 64
        and gate.explored == gate.stats()["lengths_explored_steps"]
    )


def test_verify_cost_flat_in_draft_nodes_fits_a_zero_slope():
    """On the CPU engine at bs 1 a verify step costs the same for 1 or 15 draft nodes
    (one GEMM block): the fitted slope comes out around 0, now and then below it. A
    negative slope is noise: the fit takes b = 0 rather than keeping the prior (which
    priced a node at 15 ms there and held for a whole run)."""
    rng = random.Random(1)
    cost = VerifyCost(cost_prior=0.1, roofline=_cpu_smollm2_roofline())
    for _ in range(MIN_STEPS * 4):
        d = rng.choice([0, rng.randint(1, 15)])
        cost.on_step(1, d, 0.048 + (0.039 if d else 0.0) - 0.0001 * d + rng.gauss(0, 1e-4))
    assert cost.fitted
    t0, e, b = cost.step_costs(1, 16)
    assert b == 0.0 and t0 == pytest.approx(0.048, abs=2e-3) and e == pytest.approx(0.038, abs=3e-3)


def test_trim_reports_each_cut_drafts_expected_tokens_and_weighs_by_the_scale():
    trees = [_chain([0.9, 0.8, 0.5, 0.1]), _chain([0.3, 0.2]), DraftTree()]
    cut, expected = trim_trees(trees, SAME, t0=1.0, b=0.1)
    assert [len(t) for t in cut] == [3, 0, 0]
    assert expected == pytest.approx([0.9 + 0.8 + 0.5, 0.0, 0.0])
    # Halved (verified drafts realised half of what was expected), only the surest nodes
    # still pay; the expected sums stay the calibration's own.
    cut, expected = trim_trees(trees, SAME, t0=1.0, b=0.1, scale=0.5)
    assert [len(t) for t in cut] == [2, 0, 0]
    assert expected == pytest.approx([0.9 + 0.8, 0.0, 0.0])
    assert trim_trees([DraftTree()], SAME, 1.0, 0.1) == ([DraftTree()], [0.0])


def test_realised_ratio_starts_at_one_and_follows_the_evidence_within_bounds():
    ratio = RealisedRatio()
    assert ratio.ratio == 1.0 and ratio.scale == 1.0
    for _ in range(200):  # drafts expected to accept 2 tokens accept 1
        ratio.observe(2.0, 1)
    assert 0.5 <= ratio.ratio < 0.56 and ratio.scale == ratio.ratio
    for _ in range(200):  # and none at all: clipped at the floor
        ratio.observe(4.0, 0)
    assert ratio.ratio < ratio.low and ratio.scale == ratio.low
    ratio.observe(float("nan"), 3)  # ignored
    assert ratio.drafts == 400


def test_gate_learns_what_verified_drafts_realise_against_expected():
    gate = DraftGate(GateConfig(cost_prior=0.1))
    gate.nodes.calibrate_many = SAME  # a calibration that stays too sure of its nodes
    for i in range(50):
        rid = f"r{i}"
        cut = gate.trim([rid], [_chain([0.9, 0.9, 0.9, 0.9])], width=8)[0]
        assert len(cut) > 0
        gate.on_committed(rid, [99])  # the first drafted token rejected: the bonus only
    assert gate.realised.drafts == 50 and gate.realised.ratio < 0.5
    assert gate.stats()["lengths_realised_over_expected"] == round(gate.realised.ratio, 3)
    assert len(gate.trim(["y"], [_chain([0.9, 0.9, 0.9, 0.9])], width=8)[0]) > 0
    gate.forget("y")  # a verified draft's expectation goes with the request
    assert "y" not in gate._verified
    # A node priced at half a token (cost prior 3.5 over 7 slots): 0.9 pays as calibrated,
    # not scaled by what such drafts realised.
    tree = _chain([0.9, 0.9, 0.9, 0.9])
    for scaled, kept in ((True, 0), (False, 4)):
        other = DraftGate(GateConfig(cost_prior=3.5, realised_scale=scaled))
        other.nodes.calibrate_many, other.realised = SAME, gate.realised
        assert len(other.trim(["x"], [tree], width=8)[0]) == kept


def test_a_fit_that_closed_the_gate_explores_until_its_window_holds_verify_steps():
    """One slow stretch of verify steps early on (a cold cache, a neighbour's burst)
    fits verify as dear: the gate closes, the window fills with plain steps, and a window
    without verify steps cannot refit. While the fit's window holds fewer than
    MIN_VERIFY_STEPS verify steps the gate explores as before the fit, so the steps'
    real cost (cheap here) reaches the fit and the gate opens again."""
    from sglang_spec_ext.suffix.gate import EXPLORE_EVERY
    from sglang_spec_ext.suffix.lengths import MIN_VERIFY_STEPS, WINDOW

    bs = 16
    gate = DraftGate(GateConfig())
    gate.cost = VerifyCost(cost_prior=0.1)
    for i in range(MIN_STEPS):  # plain steps at 100 ms; verify steps timed at 500 ms
        d = 0 if i % 2 else 16 + i
        gate.cost.on_step(bs, d, 0.1 if d == 0 else 0.5)
    assert gate.cost.fitted and gate.cost.verify_steps == MIN_VERIFY_STEPS
    assert not gate.cost.starved
    rids = [f"r{i}" for i in range(bs)]
    verified = []
    for _ in range(WINDOW + 64):
        cut = gate.trim(rids, [_chain([0.7, 0.6, 0.5]) for _ in rids], width=16)
        d = sum(len(t) for t in cut)
        verified.append(d > 0)
        gate.on_step_time(bs, d > 0, 0.1 + (0.002 + 0.0002 * d if d else 0.0), d)
    aged_out = WINDOW - MIN_STEPS  # steps until the slow verify steps leave the window
    assert not any(verified[: aged_out - 1]), "the stale fit kept the gate closed until then"
    assert gate.explored >= 1
    assert all(verified[-32:]), "the refitted cost opens the gate"
    assert sum(verified[aged_out : aged_out + MIN_VERIFY_STEPS * EXPLORE_EVERY]) >= 1


def _reference_calibrate(cal: NodeCalibration, tree: DraftTree) -> np.ndarray:
    """Per-node definition: conditionals calibrated, multiplied down each path."""
    cond = cal.conditional(conditional_probs(tree), tree.match_len,
                           np.asarray(tree.origins[: len(tree.probs)]) if tree.origins else None)  # fmt: skip
    out = np.empty_like(cond)
    for i, parent in enumerate(tree.parents[: cond.size]):
        out[i] = cond[i] * (out[parent] if parent >= 0 else 1.0)
    return out


def _reference_observe(cal: NodeCalibration, tree: DraftTree, committed: list[int]) -> int:
    """Per-node definition: a node is observed where its parent is on the target's path
    (or the root) and the committed tokens reach its depth."""
    from sglang_spec_ext.suffix.draft import SUFFIX_NODE
    from sglang_spec_ext.suffix.lengths import match_bucket

    cond = conditional_probs(tree)
    on_path, depth, seen = [False] * cond.size, [0] * cond.size, 0
    for i in range(cond.size):
        parent = tree.parents[i]
        depth[i] = 1 if parent < 0 else depth[parent] + 1
        if (parent >= 0 and not on_path[parent]) or depth[i] > len(committed):
            continue
        on_path[i] = committed[depth[i] - 1] == tree.tokens[i]
        b, hit, seen = cal._bins(np.array([cond[i]]))[0], float(on_path[i]), seen + 1
        origin = tree.origins[i] if tree.origins else SUFFIX_NODE
        if origin == SUFFIX_NODE:
            cal.seen[b] += 1.0
            cal.hits[b] += hit
            cal.cell_seen[match_bucket(tree.match_len), b] += 1.0
            cal.cell_hits[match_bucket(tree.match_len), b] += hit
        else:
            cal.origin_seen[origin, b] += 1.0
            cal.origin_hits[origin, b] += hit
    return seen


def test_batched_calibration_and_labels_equal_the_per_node_definition():
    """NodeCalibration runs a batch's drafts as flat arrays (one pass per tree depth);
    its figures are those of the per-node walk, exactly: calibrated probabilities bit for
    bit, labels and counts the same, on random trees with grammar origins."""
    rng = random.Random(7)

    def random_tree() -> DraftTree:
        n = rng.randint(0, 14)
        parents = [rng.randint(-1, i - 1) for i in range(n)]
        probs: list[float] = []
        for p in parents:
            probs.append(rng.random() * (1.0 if p < 0 else probs[p]))
        origins = [rng.choice([0, 0, 0, 1, 2]) for _ in range(n)] if rng.random() < 0.3 else []
        return DraftTree(tokens=[rng.randint(1, 4) for _ in range(n)], parents=parents,
                         probs=probs, score=sum(probs), match_len=rng.randint(0, 40),
                         origins=origins)  # fmt: skip

    batched, reference = NodeCalibration(), NodeCalibration()
    for _step in range(60):
        trees = [random_tree() for _ in range(rng.randint(1, 20))]
        got = batched.calibrate_many(trees)
        assert len(got) == len(trees)
        for tree, probs in zip(trees, got, strict=True):
            assert np.array_equal(probs, _reference_calibrate(reference, tree))
        labelled = [(t, [rng.randint(1, 4) for _ in range(rng.randint(0, 6))]) for t in trees]
        counts = batched.observe_many(labelled)
        assert counts.tolist() == [_reference_observe(reference, t, c) for t, c in labelled]
        for name in ("seen", "hits", "cell_seen", "cell_hits", "origin_seen", "origin_hits"):
            assert np.array_equal(getattr(batched, name), getattr(reference, name)), name
    assert batched.seen.sum() > 100 and batched.origin_seen.sum() > 10
    assert batched.calibrate_many([]) == [] and batched.observe_many([]).size == 0
