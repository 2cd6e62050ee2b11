"""The recycled draft source (suffix/recycling.py, suffix/recycler.py): the bounded top-k
table per scope, the learned rank rates, the rank template, the batch fill and the merge
with suffix drafts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_spec_ext.suffix.draft import RECYCLED_NODE, SUFFIX_NODE, DraftTree
from sglang_spec_ext.suffix.recycler import RecycleConfig, Recycler
from sglang_spec_ext.suffix.recycling import (
    RankRates,
    RecyclingTable,
    fill_template,
    merge_trees,
    rank_template,
)


def _rows(*succ):
    return np.array([list(s) + [-1] * (4 - len(s)) for s in succ], dtype=np.int32)


def test_table_latest_row_wins_and_unknown_tokens_are_minus_one():
    t = RecyclingTable(k=4)
    t.feed("a", np.array([5, 7]), _rows((1, 2, 3, 4), (9, 8, 7, 6)))
    t.feed("a", np.array([5]), _rows((4, 3, 2, 1)))
    assert t.rows("a", np.array([5, 7, 6, 10**6])).tolist() == [
        [4, 3, 2, 1],
        [9, 8, 7, 6],
        [-1, -1, -1, -1],
        [-1, -1, -1, -1],
    ]


def test_a_scope_never_sees_another_scopes_rows():
    t = RecyclingTable(k=4)
    t.feed("tenant-a", np.array([5]), _rows((1, 2, 3, 4)))
    assert t.rows("tenant-b", np.array([5])).tolist() == [[-1, -1, -1, -1]]


def test_tables_are_bounded_by_scopes_and_vocab():
    t = RecyclingTable(k=2, max_scopes=3, max_vocab=4096)
    for s in range(10):
        t.feed(s, np.array([s, 5000]), np.array([[1, 2], [3, 4]]))  # 5000: past the bound
    assert t.scopes() == 3 and t.scopes_evicted == 7
    assert t.nbytes() <= 3 * 4096 * 2 * 4
    assert t.rows(0, np.array([0])).tolist() == [[-1, -1]]  # evicted, least recently used
    assert t.rows(9, np.array([9])).tolist() == [[1, 2]]


def test_rank_rates_learn_which_rank_the_target_takes():
    r = RankRates(k=4, prior_weight=1.0)
    rows = np.array([[1, 2, 3, 4]] * 100)
    nxt = np.array([2] * 80 + [9] * 20)  # rank 1 four times in five, else none
    r.observe(rows, nxt)
    rates = r.rates()
    assert rates[1] == pytest.approx(0.8, abs=0.01) and rates[0] < 0.01
    r.observe(np.array([[-1, -1, -1, -1]]), np.array([1]))  # unknown rows teach nothing
    assert r.seen == 100


def test_template_is_best_first_and_topological():
    parents, ranks, probs = rank_template(np.array([0.5, 0.2, 0.1]), 7, max_depth=3)
    assert len(parents) == 7
    assert all(p < i for i, p in enumerate(parents))
    assert list(probs) == sorted(probs, reverse=True)
    depth = [0] * 7
    for i, p in enumerate(parents):
        depth[i] = 1 if p < 0 else depth[p] + 1
    assert max(depth) <= 3
    assert probs[0] == pytest.approx(0.5) and ranks[0] == 0


def test_fill_drops_unknown_subtrees_and_scopes_apart():
    t = RecyclingTable(k=2)
    t.feed("a", np.array([1, 2]), np.array([[2, 3], [4, 5]]))
    template = rank_template(np.array([0.6, 0.3]), 6)
    (a, b) = fill_template(t, ["a", "b"], [1, 1], template)
    assert len(b) == 0  # scope b knows nothing
    assert a.tokens[0] == 2 and a.parents[0] == -1
    assert set(a.origins) == {RECYCLED_NODE}
    # the chain 1 -> 2 -> 4 is there; 3 and 4 have no rows, so nothing hangs below them
    kids = {a.tokens[i] for i, p in enumerate(a.parents) if p == 0}
    assert kids == {4, 5}
    assert all(p < i for i, p in enumerate(a.parents))


def test_merge_takes_the_larger_estimate_and_keeps_a_tree():
    suffix = DraftTree(tokens=[2, 7], parents=[-1, 0], probs=[0.9, 0.8], score=1.7, match_len=3)
    recycled = DraftTree(tokens=[2, 3, 9], parents=[-1, 0, -1], probs=[0.45, 0.2, 0.1],
                         score=0.75, origins=[RECYCLED_NODE] * 3)  # fmt: skip
    merged = merge_trees(suffix, None, recycled, 4)
    assert merged.tokens == [2, 7, 3, 9]
    assert merged.parents == [-1, 0, 0, -1]
    # the recycled child of the shared node 2 inherits the suffix's 0.9 for it
    assert merged.probs[2] == pytest.approx(0.9 * 0.2 / 0.45)
    assert merged.origins == [SUFFIX_NODE, SUFFIX_NODE, RECYCLED_NODE, RECYCLED_NODE]
    assert merge_trees(suffix, None, recycled, 2).tokens == [2, 7]
    assert merge_trees(suffix, None, DraftTree(), 1).tokens == [2]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 12)), max_size=12),
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 12)), max_size=12),
    st.integers(0, 12),
)
def test_merge_is_always_a_valid_best_first_tree(a, b, budget):
    def tree(spec, origin):
        tokens, parents, probs = [], [], []
        for tok, up in spec:
            parent = up % (len(tokens) + 1) - 1  # any node built so far, or the root
            p = (0.9 if parent < 0 else probs[parent]) * 0.7
            if (parent, tok) in {(pp, tt) for pp, tt in zip(parents, tokens, strict=True)}:
                continue
            tokens.append(tok)
            parents.append(parent)
            probs.append(p)
        return DraftTree(tokens=tokens, parents=parents, probs=probs, score=sum(probs),
                         origins=[origin] * len(tokens))  # fmt: skip

    merged = merge_trees(tree(a, SUFFIX_NODE), None, tree(b, RECYCLED_NODE), budget)
    assert len(merged) <= max(budget, 0)
    seen = set()
    for i, (tok, p) in enumerate(zip(merged.tokens, merged.parents, strict=True)):
        assert p < i
        assert (p, tok) not in seen  # no token twice among siblings
        seen.add((p, tok))
        if p >= 0:
            assert merged.probs[i] <= merged.probs[p] + 1e-12


def test_recycler_drafts_what_the_target_said_and_learns_from_commits():
    rec = Recycler(RecycleConfig(k=4))
    rec.feed("", np.array([10, 11, 12]), _rows((11, 50), (12, 51), (13, 52)))
    (draft,) = rec.draft(["r"], [""], [10], [DraftTree()], 7)
    chain = [draft.tokens.index(t) for t in (11, 12, 13)]
    assert [draft.parents[i] for i in chain] == [-1, chain[0], chain[1]]
    rec.observe("r", "", 10, [11, 12, 13])
    assert rec.rates.seen == 3 and rec.stats()["recycle_transitions_seen"] == 3
    off = Recycler(RecycleConfig(k=0))
    suffix = DraftTree(tokens=[1, 2, 3], parents=[-1, 0, 1], probs=[0.9, 0.8, 0.7], score=2.4)
    assert off.draft(["r"], [""], [10], [suffix], 2)[0].tokens == [1, 2]


def test_merge_ranks_by_calibrated_estimates_and_emits_raw_probabilities():
    """The suffix draft's raw probabilities say 0.9 for a node its calibration says is 0.1:
    the recycled node (0.45) outranks it, and the tree carries the raw values (what the
    draft gate calibrates from)."""
    suffix = DraftTree(tokens=[2], parents=[-1], probs=[0.9], score=0.9, match_len=1)
    recycled = DraftTree(tokens=[5], parents=[-1], probs=[0.45], score=0.45,
                         origins=[RECYCLED_NODE])  # fmt: skip
    merged = merge_trees(suffix, np.array([0.1]), recycled, 1)
    assert merged.tokens == [5] and merged.probs == [0.45]
    both = merge_trees(suffix, np.array([0.1]), recycled, 2)
    assert both.tokens == [2, 5] and both.probs == [0.9, 0.45]


def test_a_narrower_row_leaves_no_stale_successors_and_the_last_repeat_wins():
    t = RecyclingTable(k=3)
    t.feed("", np.array([4]), np.array([[9, 9, 9]]))
    t.feed("", np.array([4]), np.array([[8]]))
    assert t.rows("", np.array([4])).tolist() == [[8, -1, -1]]
    t.feed("", np.array([4, 6, 4]), np.array([[1, 1, 1], [2, 2, 2], [3, 3, 3]]))
    assert t.rows("", np.array([4, 6])).tolist() == [[3, 3, 3], [2, 2, 2]]
