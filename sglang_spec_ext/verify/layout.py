"""Draft trees in the host's verify layout (engine-agnostic, numpy only).

A draft tree is given by its nodes' parents (``parents[i] < i``; -1 = child of
the root, the request's last committed token), as in
:class:`sglang_spec_ext.suffix.DraftTree`. The host's NGRAM verify layout for a
verify width W (root included), per request:

* ``tokens[W]``: index 0 is the root token, draft nodes follow in topological
  order, padding nodes are token 0 chained below the last node (see
  :func:`pack_batch` for why they never have siblings);
* ``mask[W][W]`` (bool): ``mask[i][j]`` iff j is an ancestor of i or j == i.

A batch concatenates requests: tokens int64 ``[bs * W]``, mask bool
``[bs * W * W]``. In every function taking ``width``, index space 0..W-1 has the
root at 0 and draft node i at i + 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Protocol

import numpy as np


class _Tree(Protocol):
    tokens: list[int]
    parents: list[int]


def _check_parents(parents: Sequence[int], width: int | None = None) -> list[int]:
    out = [int(p) for p in parents]
    for i, p in enumerate(out):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}]={p} is invalid: expected -1 <= parent < {i}")
    if width is not None:
        if width < 1:
            raise ValueError(f"width={width} is invalid: expected >= 1 (the root)")
        if len(out) > width - 1:
            raise ValueError(
                f"{len(out)} draft nodes do not fit width {width} (at most {width - 1})"
            )
    return out


def _full_parents(parents: Sequence[int], width: int) -> np.ndarray:
    """Parents in the width index space: root 0 has parent -1, padding node j has
    parent j - 1 (a chain below the last node, which is a leaf)."""
    par = np.arange(-1, width - 1, dtype=np.int64)
    n = len(parents)
    if n:
        par[1 : n + 1] = np.asarray(parents, dtype=np.int64) + 1
    return par


def depths(parents: Sequence[int]) -> np.ndarray:
    """Depth of each draft node below the root (children of the root: 1)."""
    par = _check_parents(parents)
    out = np.empty(len(par), dtype=np.int64)
    for i, p in enumerate(par):
        out[i] = 1 if p < 0 else out[p] + 1
    return out


def tree_mask(parents: Sequence[int], width: int) -> np.ndarray:
    """bool [W, W]: row i marks node i and its ancestors (root row = [1, 0, ...])."""
    return masks_from_parents(_full_parents_checked(parents, width))[0]


def retrieve_links(parents: Sequence[int], width: int) -> tuple[np.ndarray, np.ndarray]:
    """First-child and next-sibling indices (int64 [W], -1 for none), padding
    included, siblings ordered by index."""
    next_token, next_sibling = links_from_parents(_full_parents_checked(parents, width))
    return next_token[0], next_sibling[0]


def _full_parents_checked(parents: Sequence[int], width: int) -> np.ndarray:
    """[1, W]: one tree's full parents, checked as :func:`_check_parents` checks them."""
    return _full_parents(_check_parents(parents, width), width)[None, :]


def full_parents_batch(trees_parents: Sequence[Sequence[int]], width: int) -> np.ndarray:
    """int64 [k, W]: each tree's parents in the width index space (:func:`_full_parents`:
    the root -1, padding chained below the last node), every tree checked (a
    :class:`ValueError` names the tree and the node)."""
    k = len(trees_parents)
    lens = np.fromiter((len(p) for p in trees_parents), dtype=np.int64, count=k)
    if k and (lens > width - 1).any():
        b = int(np.argmax(lens > width - 1))
        raise ValueError(
            f"tree {b}: {lens[b]} draft nodes do not fit width {width} (at most {width - 1})"
        )
    flat = np.fromiter(chain.from_iterable(trees_parents), np.int64, int(lens.sum()))
    rows = np.repeat(np.arange(k), lens)
    cols = index_within(lens)  # index within its tree
    bad = (flat < -1) | (flat >= cols)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"tree {rows[i]}: parents[{cols[i]}]={flat[i]} is invalid: "
            f"expected -1 <= parent < {cols[i]}"
        )
    par = np.tile(np.arange(-1, width - 1, dtype=np.int64), (k, 1))
    par[rows, cols + 1] = flat + 1
    return par


def masks_from_parents(par: np.ndarray) -> np.ndarray:
    """bool [k, W, W]: :func:`tree_mask` of each row of full parents ``par`` [k, W]: a
    node's row is its parent's plus itself, topological over nodes, vectorised over rows."""
    k, width = par.shape
    mask = np.zeros((k, width, width), dtype=bool)
    mask[:, :, 0] = True  # every node sees the root
    diag = np.arange(width)
    mask[:, diag, diag] = True
    rows = np.arange(k)
    for i in range(2, width):  # the children of the root are complete already
        mask[:, i] |= mask[rows, par[:, i]]
    return mask


def parents_from_masks(masks: np.ndarray) -> np.ndarray:
    """int64 [k, W]: full parents (root -1) of ancestor masks [k, W, W], each node's
    deepest proper ancestor (``replay.protocol.tree_from_ancestor_mask`` per row)."""
    m = np.asarray(masks, dtype=bool)
    strict = np.tril(m, k=-1)  # proper ancestors: parents precede children
    parent = np.where(strict, m.sum(-1)[:, None, :], -1).argmax(-1)
    parent[:, 0] = -1
    return parent


def links_from_parents(par: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`retrieve_links` of each row of full parents ``par`` [k, W]: first-child and
    next-sibling indices, int64 [k, W], -1 for none."""
    width = par.shape[1]
    idx = np.arange(width)
    node = idx >= 1  # the root is nobody's child
    child = (par[:, None, :] == idx[None, :, None]) & node  # [k, p, i]: i a child of p
    sibling = ((par[:, :, None] == par[:, None, :]) & (idx[None, :] > idx[:, None])
               & node[:, None] & node)  # [k, i, j]: j a later sibling of i  # fmt: skip
    next_token = np.where(child.any(-1), child.argmax(-1), -1)
    next_sibling = np.where(sibling.any(-1), sibling.argmax(-1), -1)
    return next_token.astype(np.int64), next_sibling.astype(np.int64)


def index_within(lens: Sequence[int] | np.ndarray) -> np.ndarray:
    """For rows laid out request after request (``lens[b]`` rows of request ``b``), each
    row's index within its request: ``[0 .. lens[0]-1, 0 .. lens[1]-1, ...]``."""
    lens = np.asarray(lens, dtype=np.int64)
    return np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)


def kept_rows(lens: Sequence[int] | np.ndarray, width: int) -> np.ndarray:
    """Indices into ``len(lens) x width`` padded rows of each request's first ``lens[b]``
    (a ragged verify's rows in the padded layout)."""
    lens = np.asarray(lens, dtype=np.int64)
    return np.repeat(np.arange(lens.size, dtype=np.int64) * width, lens) + index_within(lens)


def pack_batch(
    trees: Sequence[_Tree], root_tokens: Sequence[int], width: int
) -> tuple[np.ndarray, np.ndarray]:
    """Verify input for a batch: tokens int64 [bs * W] and mask bool [bs * W * W].

    Trees with fewer than W - 1 nodes are padded with a chain of token-0 nodes
    hanging from the tree's last node (a leaf: children follow their parent), or
    from the root when the tree is empty. So a padding node never has a sibling:
    a sampling verifier that walks siblings with one coin (the host's kernel)
    would otherwise accept a token repeated among siblings with inflated
    probability. More than W - 1 nodes is an error. Vectorised over the batch.
    """
    bs = len(trees)
    if len(root_tokens) != bs:
        raise ValueError(f"{bs} trees but {len(root_tokens)} root tokens")
    if width < 1:
        raise ValueError(f"width={width} is invalid: expected >= 1 (the root)")
    lens = np.fromiter((len(t.parents) for t in trees), dtype=np.int64, count=bs)
    n_tok = np.fromiter((len(t.tokens) for t in trees), dtype=np.int64, count=bs)
    if not np.array_equal(lens, n_tok):
        b = int(np.argmax(lens != n_tok))
        raise ValueError(f"tree {b}: {n_tok[b]} tokens but {lens[b]} parents")
    par = full_parents_batch([t.parents for t in trees], width)  # checked
    flat_tok = np.fromiter(
        chain.from_iterable(t.tokens for t in trees), dtype=np.int64, count=int(lens.sum())
    )
    tokens = np.zeros((bs, width), dtype=np.int64)
    tokens[:, 0] = np.asarray(root_tokens, dtype=np.int64).reshape(bs)
    tokens[np.repeat(np.arange(bs), lens), index_within(lens) + 1] = flat_tok
    mask = masks_from_parents(par)
    return tokens.reshape(-1), mask.reshape(-1)


def accepted_length(tree: _Tree, continuation: Sequence[int]) -> int:
    """Draft tokens accepted by greedy verification against the true next tokens
    (the target's bonus token not included)."""
    parents = tree.parents
    tokens = tree.tokens
    node = -1
    accepted = 0
    start = 0
    for true_token in continuation:
        nxt = -1
        for i in range(start, len(tokens)):  # children come after their parent
            if parents[i] == node and tokens[i] == true_token:
                nxt = i
                break
        if nxt < 0:
            break
        node = nxt
        start = nxt + 1
        accepted += 1
    return accepted
