"""Draft tree -> host verify layout (sglang_spec_ext.verify.layout)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from sglang_spec_ext.suffix import DraftTree
from sglang_spec_ext.verify.layout import (
    accepted_length,
    depths,
    pack_batch,
    retrieve_links,
    tree_mask,
)


def tree(tokens, parents) -> DraftTree:
    return DraftTree(list(tokens), list(parents), [1.0] * len(tokens), float(len(tokens)), 1)


def random_parents(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(-1, i) for i in range(n)]


# Brute force, straight from the definitions.
def ancestors(parents: list[int], i: int) -> set[int]:
    """Ancestors of draft node i in width space (root = 0, node i -> i + 1)."""
    out = {0}
    p = parents[i]
    while p >= 0:
        out.add(p + 1)
        p = parents[p]
    return out


def brute_mask(parents: list[int], width: int) -> np.ndarray:
    n = len(parents)
    full = list(parents) + list(range(n - 1, width - 2))  # padding: chain below the last node
    m = np.zeros((width, width), dtype=bool)
    m[0, 0] = True
    for i in range(width - 1):
        for j in ancestors(full, i) | {i + 1}:
            m[i + 1, j] = True
    return m


def brute_links(parents: list[int], width: int):
    full = [None] + [p + 1 for p in parents] + list(range(len(parents), width - 1))
    kids = {i: [j for j in range(1, width) if full[j] == i] for i in range(width)}
    nxt = [kids[i][0] if kids[i] else -1 for i in range(width)]
    sib = [-1] * width
    for ks in kids.values():
        for a, b in zip(ks, ks[1:], strict=False):
            sib[a] = b
    return nxt, sib


def brute_accept(t: DraftTree, cont: list[int]) -> int:
    best = 0
    for i in range(len(t.tokens)):  # deepest node whose path spells a prefix of cont
        path = []
        j = i
        while j >= 0:
            path.append(t.tokens[j])
            j = t.parents[j]
        path.reverse()
        if path == cont[: len(path)]:
            best = max(best, len(path))
    return best


def test_chain():
    m = tree_mask([-1, 0, 1], 4)
    assert m.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]
    assert depths([-1, 0, 1]).tolist() == [1, 2, 3]
    nxt, sib = retrieve_links([-1, 0, 1], 4)
    assert nxt.tolist() == [1, 2, 3, -1] and sib.tolist() == [-1, -1, -1, -1]


def test_star():
    m = tree_mask([-1, -1, -1], 4)
    assert m.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, False, True, False],
        [True, False, False, True],
    ]
    assert depths([-1, -1, -1]).tolist() == [1, 1, 1]
    nxt, sib = retrieve_links([-1, -1, -1], 4)
    assert nxt.tolist() == [1, -1, -1, -1] and sib.tolist() == [-1, 2, 3, -1]


def test_padding_is_a_chain_below_the_last_node_without_siblings():
    m = tree_mask([-1, -1], 5)  # two children of the root, then two padding nodes
    assert m[3].tolist() == [True, False, True, True, False]
    assert m[4].tolist() == [True, False, True, True, True]
    nxt, sib = retrieve_links([-1, -1], 5)
    assert nxt.tolist() == [1, -1, 3, 4, -1] and sib.tolist() == [-1, 2, -1, -1, -1]
    # No padding node has a sibling: a one-coin sampling verifier walking siblings
    # would accept a token repeated among siblings with inflated probability.
    assert (sib[3:] == -1).all()
    tokens, mask = pack_batch([tree([9, 8], [-1, -1])], [7], 5)
    assert tokens.tolist() == [7, 9, 8, 0, 0]
    assert mask.dtype == np.bool_ and mask.shape == (25,)
    assert np.array_equal(mask.reshape(5, 5), m)


def test_deep_tree():
    parents = list(range(-1, 62))  # a chain of 63 nodes
    m = tree_mask(parents, 64)
    assert np.array_equal(m, np.tril(np.ones((64, 64), dtype=bool)))
    assert depths(parents)[-1] == 63


def test_empty_tree_and_width_one():
    assert tree_mask([], 1).tolist() == [[True]]
    tokens, mask = pack_batch([tree([], []), tree([], [])], [3, 4], 1)
    assert tokens.tolist() == [3, 4] and mask.tolist() == [True, True]
    tokens, mask = pack_batch([], [], 4)
    assert tokens.shape == (0,) and mask.shape == (0,)


def test_errors():
    with pytest.raises(ValueError, match="do not fit"):
        pack_batch([tree([1, 2, 3], [-1, 0, 1])], [0], 3)
    with pytest.raises(ValueError, match="parents"):
        tree_mask([0], 4)  # a node cannot be its own parent
    with pytest.raises(ValueError, match="parents"):
        depths([-1, 5])
    with pytest.raises(ValueError, match="root tokens"):
        pack_batch([tree([1], [-1])], [], 4)
    with pytest.raises(ValueError, match="tokens"):
        pack_batch([DraftTree([1, 2], [-1], [1.0], 1.0, 1)], [0], 4)


def test_random_trees_match_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        width = rng.randrange(1, 12)
        n = rng.randrange(0, width)
        parents = random_parents(rng, n)
        assert np.array_equal(tree_mask(parents, width), brute_mask(parents, width))
        nxt, sib = retrieve_links(parents, width)
        assert (nxt.tolist(), sib.tolist()) == brute_links(parents, width)
        d = depths(parents)
        assert all(d[i] == len(ancestors(parents, i)) for i in range(n))


def test_pack_batch_concatenates_requests():
    rng = random.Random(1)
    width = 6
    trees = []
    for _ in range(7):
        n = rng.randrange(0, width)
        trees.append(tree([rng.randrange(1, 100) for _ in range(n)], random_parents(rng, n)))
    roots = [rng.randrange(100) for _ in trees]
    tokens, mask = pack_batch(trees, roots, width)
    assert tokens.dtype == np.int64 and tokens.shape == (7 * width,)
    assert mask.shape == (7 * width * width,)
    tok2 = tokens.reshape(7, width)
    mask3 = mask.reshape(7, width, width)
    for b, t in enumerate(trees):
        n = len(t.tokens)
        assert tok2[b].tolist() == [roots[b], *t.tokens] + [0] * (width - 1 - n)
        assert np.array_equal(mask3[b], brute_mask(t.parents, width))


def test_accepted_length():
    t = tree([5, 6, 7, 6, 9], [-1, 0, 1, -1, 3])  # 5-6-7 and 6-9
    assert accepted_length(t, [5, 6, 7, 8]) == 3
    assert accepted_length(t, [5, 6, 1]) == 2
    assert accepted_length(t, [6, 9, 9]) == 2
    assert accepted_length(t, [7]) == 0
    assert accepted_length(t, []) == 0
    assert accepted_length(tree([], []), [1, 2]) == 0


def test_accepted_length_matches_brute_force():
    rng = random.Random(2)
    for _ in range(500):
        n = rng.randrange(0, 10)
        t = tree([rng.randrange(3) for _ in range(n)], random_parents(rng, n))
        # distinct sibling tokens, as drafters produce
        seen = set()
        keep = [
            i
            for i in range(n)
            if (t.parents[i], t.tokens[i]) not in seen and not seen.add((t.parents[i], t.tokens[i]))
        ]
        if len(keep) != n:
            continue
        cont = [rng.randrange(3) for _ in range(rng.randrange(0, 8))]
        assert accepted_length(t, cont) == brute_accept(t, cont)


def test_batched_masks_parents_and_links_equal_the_per_tree_ones():
    """HYBRID packs and splices a batch's rows at once (``masks_from_parents``,
    ``parents_from_masks``, ``links_from_parents``): the same arrays as ``tree_mask``,
    ``tree_from_ancestor_mask`` and ``retrieve_links`` per tree, padding included."""
    import random

    from sglang_spec_ext.replay.protocol import tree_from_ancestor_mask
    from sglang_spec_ext.verify.layout import (
        full_parents_batch,
        links_from_parents,
        masks_from_parents,
        parents_from_masks,
        retrieve_links,
        tree_mask,
    )

    rng = random.Random(3)
    for width in (1, 2, 5, 16):
        trees = []
        for _ in range(40):
            n = rng.randint(0, width - 1)
            trees.append([rng.randint(-1, i - 1) for i in range(n)])
        full = full_parents_batch(trees, width)
        masks = masks_from_parents(full)
        nt, ns = links_from_parents(full)
        for b, parents in enumerate(trees):
            assert np.array_equal(masks[b], tree_mask(parents, width))
            want_nt, want_ns = retrieve_links(parents, width)
            assert np.array_equal(nt[b], want_nt) and np.array_equal(ns[b], want_ns)
        back = parents_from_masks(masks)
        assert np.array_equal(back, full)
        for b in range(len(trees)):
            draft = tree_from_ancestor_mask(list(range(width)), masks[b])
            assert list(back[b, 1:] - 1) == list(draft.parents)
    with pytest.raises(ValueError, match="parents"):
        full_parents_batch([[-1], [0]], 4)  # the second tree's node is its own parent
    with pytest.raises(ValueError, match="do not fit width 4"):
        full_parents_batch([[-1, -1, -1, -1]], 4)
