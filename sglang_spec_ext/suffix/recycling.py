"""Drafts for text nobody wrote before: the target's own top-k, recycled.

Every verify step computes the target's logits at every draft node. At a node whose token
is ``x``, the top-k of those logits are the tokens the target finds likely after ``x``
(in that context). Kept as an adjacency table ``x -> top-k successors`` (refreshed by every
step: the latest logits win) they draft any text, with no draft model ("token recycling",
Luo et al. 2024). This module is engine-agnostic (numpy only):

* :class:`RecyclingTable`: the table, one per tenant scope (a tenant never drafts from
  another's logits), each a dense ``[vocab, k]`` array grown to the largest token id seen,
  at most ``max_scopes`` of them (least recently used evicted): bounded by
  ``max_scopes x vocab x k x 4`` bytes.
* :class:`RankRates`: how often the target's next token is the rank-``r`` successor the
  table held for the token before it, learned from every committed transition: the chance
  a recycled node is accepted given its parent was.
* :func:`rank_template`: the best recycled tree shape for a node budget (a best-first tree
  over ranks by the learned rates; it depends on the rates only, not on the tokens), and
  :func:`fill_template`: its tokens for a whole batch at once, one table gather per level.
* :func:`merge_trees`: one tree from a suffix draft and a recycled draft, nodes chosen by
  their estimated path acceptance (a token both propose takes the larger), best first.

:class:`Recycler` ties them together for a worker (or the replay): ``observe`` the tokens
each request committed, ``feed`` the step's top-k, ``draft`` the merged trees.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import numpy as np

from .draft import RECYCLED_NODE, SUFFIX_NODE, DraftTree

#: Prior conditional acceptance of the rank-r successor before any evidence (a target's
#: top-1 is the greedy next token about half the time on text it has not seen; the tail
#: falls fast). Replaced by what :class:`RankRates` learns as evidence comes.
PRIOR_RATES = (0.45, 0.12, 0.06, 0.04, 0.03, 0.02, 0.015, 0.01)


class RecyclingTable:
    """``token -> the target's top-k next tokens`` from its latest logits, per scope."""

    def __init__(self, k: int = 8, max_scopes: int = 16, max_vocab: int = 1 << 20) -> None:
        if k < 1:
            raise ValueError(f"recycling table: k must be >= 1, got {k}")
        self.k = k
        self.max_scopes = max(1, max_scopes)
        self.max_vocab = max_vocab
        self._tables: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self.rows_fed = 0
        self.scopes_evicted = 0

    def _table(self, scope: Hashable, need: int) -> np.ndarray:
        table = self._tables.get(scope)
        if table is not None:
            self._tables.move_to_end(scope)
            if table.shape[0] >= need:
                return table
        size = 1 << max(10, int(need - 1).bit_length())  # grown in powers of two
        grown = np.full((min(size, self.max_vocab), self.k), -1, dtype=np.int32)
        if table is not None:
            grown[: table.shape[0]] = table
        self._tables[scope] = grown
        while len(self._tables) > self.max_scopes:
            self._tables.popitem(last=False)
            self.scopes_evicted += 1
        return grown

    def feed(self, scope: Hashable, tokens: np.ndarray, topk: np.ndarray) -> None:
        """Rows of the target's logits: ``tokens[i]``'s successors are ``topk[i]`` (best
        first; a later row of the same token wins). Ids outside the table's bound are
        skipped."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            return
        topk = np.asarray(topk).reshape(tokens.size, -1)[:, : self.k]
        keep = (tokens >= 0) & (tokens < self.max_vocab)
        if not keep.all():
            tokens, topk = tokens[keep], topk[keep]
            if tokens.size == 0:
                return
        # the last row of a token repeated in this feed wins (kept alone: numpy does not
        # promise an order for repeated indices)
        _, last = np.unique(tokens[::-1], return_index=True)
        keep_last = tokens.size - 1 - last
        tokens, topk = tokens[keep_last], topk[keep_last]
        table = self._table(scope, int(tokens.max()) + 1)
        table[tokens] = -1  # a narrower row leaves no stale successors behind
        table[tokens, : topk.shape[1]] = topk
        self.rows_fed += int(tokens.size)

    def rows(self, scope: Hashable, tokens: np.ndarray) -> np.ndarray:
        """The successors of each of ``tokens`` (``[n, k]``, -1 where none is known)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        out = np.full(tokens.shape + (self.k,), -1, dtype=np.int32)
        table = self._tables.get(scope)
        if table is None:
            return out
        ok = (tokens >= 0) & (tokens < table.shape[0])
        out[ok] = table[tokens[ok]]
        return out

    def scopes(self) -> int:
        return len(self._tables)

    def nbytes(self) -> int:
        return int(sum(t.nbytes for t in self._tables.values()))

    def reset(self) -> None:
        self._tables.clear()


class RankRates:
    """Chance the target's next token is the table's rank-``r`` successor of the token
    before it (given that token was committed): learned per rank from every committed
    transition whose first token the table knew, with the prior :data:`PRIOR_RATES` worth
    ``prior_weight`` observations."""

    def __init__(self, k: int, prior_weight: float = 20.0) -> None:
        prior = np.array(PRIOR_RATES[:k] + (PRIOR_RATES[-1],) * max(0, k - len(PRIOR_RATES)))
        self.prior = prior
        self.prior_weight = prior_weight
        self.seen = 0.0
        self.hits = np.zeros(k)

    def observe(self, rows: np.ndarray, nxt: np.ndarray) -> None:
        """``rows``: the table's successors of each transition's first token (``[n, k]``);
        ``nxt``: the token that followed it."""
        known = rows[:, 0] >= 0
        if not known.any():
            return
        rows, nxt = rows[known], np.asarray(nxt)[known]
        hit = rows == nxt[:, None]
        self.seen += float(rows.shape[0])
        self.hits += hit.sum(axis=0)

    def rates(self) -> np.ndarray:
        w = self.prior_weight
        return (self.hits + w * self.prior) / (self.seen + w)


def rank_template(
    rates: np.ndarray, budget: int, max_depth: int = 16
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``budget`` best recycled nodes for rank acceptance ``rates``: a tree (parents,
    each node's rank, its path probability), topological, best first."""
    parents, ranks, probs, depth = [], [], [], []
    heap: list[tuple[float, int, int, int]] = [
        (-float(rates[r]), r, -1, r) for r in range(len(rates))
    ]
    heapq.heapify(heap)
    tie = len(rates)
    while heap and len(parents) < budget:
        negp, _tie, parent, rank = heapq.heappop(heap)
        d = 1 if parent < 0 else depth[parent] + 1
        idx = len(parents)
        parents.append(parent)
        ranks.append(rank)
        probs.append(-negp)
        depth.append(d)
        if d < max_depth:
            for r in range(len(rates)):
                tie += 1
                heapq.heappush(heap, (negp * float(rates[r]), tie, idx, r))
    return np.array(parents, np.int64), np.array(ranks, np.int64), np.array(probs, np.float64)


def fill_template(
    table: RecyclingTable,
    scopes: Sequence[Hashable],
    roots: Sequence[int],
    template: tuple[np.ndarray, np.ndarray, np.ndarray],
    min_prob: float = 0.0,
) -> list[DraftTree]:
    """Recycled drafts for a batch: the template's tokens looked up below each root (one
    gather per node and scope group); a node whose parent's successors are unknown, or
    whose token repeats a sibling's, is dropped with its subtree."""
    parents, ranks, probs = template
    n, bs = len(parents), len(roots)
    if n == 0 or bs == 0:
        return [DraftTree() for _ in roots]
    tokens = np.full((bs, n + 1), -1, dtype=np.int64)  # column 0: the roots
    tokens[:, 0] = np.asarray(roots, dtype=np.int64)
    by_scope: dict[Hashable, list[int]] = {}
    for i, s in enumerate(scopes):
        by_scope.setdefault(s, []).append(i)
    for scope, rows_idx in by_scope.items():
        idx = np.array(rows_idx)
        sub = tokens[idx]
        for j in range(n):  # topological: a parent's token is known before its children
            parent_tok = sub[:, parents[j] + 1]
            succ = table.rows(scope, parent_tok)
            tok = succ[np.arange(len(idx)), ranks[j]].astype(np.int64)
            tok[parent_tok < 0] = -1
            sub[:, j + 1] = tok
        tokens[idx] = sub
    # a node is drafted where its token is known, its parent drafted, its estimate high
    # enough (siblings are distinct: they are one top-k row's ranks)
    valid = tokens[:, 1:] >= 0
    valid &= (probs >= min_prob)[None, :]
    for j in range(n):
        if parents[j] >= 0:
            valid[:, j] &= valid[:, parents[j]]
    new_index = np.cumsum(valid, axis=1) - 1  # a valid node's index in its request's tree
    out = []
    for b in range(bs):
        idx = np.flatnonzero(valid[b])
        if idx.size == 0:
            out.append(DraftTree())
            continue
        par = parents[idx]
        mapped = np.where(par >= 0, new_index[b, np.maximum(par, 0)], -1)
        prs = probs[idx].tolist()
        out.append(
            DraftTree(
                tokens=tokens[b, idx + 1].tolist(),
                parents=mapped.tolist(),
                probs=prs,
                score=float(sum(prs)),
                match_len=0,
                origins=[RECYCLED_NODE] * int(idx.size),
            )  # fmt: skip
        )
    return out


def merge_trees(
    suffix: DraftTree, suffix_probs: np.ndarray | None, recycled: DraftTree, budget: int
) -> DraftTree:
    """One tree of at most ``budget`` nodes from a suffix draft and a recycled one, both
    below the same root: the union of their paths. Nodes are ranked by their estimated
    acceptance: each node's chance given its parent is the larger of the two sources'
    where both propose it (suffix nodes by ``suffix_probs``, their calibrated path
    probabilities, or their own), its estimate the product along its path, so a recycled
    node below a likely suffix node inherits that node's estimate; the best are kept (a
    child's estimate never exceeds its parent's: the best-first cut is a tree). The tree's
    ``probs`` are on each source's own scale (a suffix node's the drafter's raw
    conditionals, a recycled node's the learned rank rates) along the kept paths, so the
    draft gate, which calibrates per origin from raw values, sees what it expects."""
    if not len(recycled):
        return suffix.first(budget)
    if not len(suffix):
        return recycled.first(budget)
    ranked = list(suffix.probs) if suffix_probs is None else [float(x) for x in suffix_probs]
    tokens: list[int] = []
    parents: list[int] = []
    cond: list[float] = []  # for ranking
    raw: list[float] = []  # for the tree's probs
    origins: list[int] = []
    index: dict[tuple[int, int], int] = {}
    sources = (
        (suffix, ranked, list(suffix.probs), SUFFIX_NODE),
        (recycled, list(recycled.probs), list(recycled.probs), RECYCLED_NODE),
    )
    for tree, rank_probs, raw_probs, default_origin in sources:
        mapped: list[int] = []
        for i, tok in enumerate(tree.tokens):
            p = tree.parents[i]
            mp = -1 if p < 0 else mapped[p]
            c = _conditional(rank_probs, p, i)
            key = (mp, int(tok))
            j = index.get(key)
            origin = tree.origins[i] if tree.origins else default_origin
            if j is None:
                j = index[key] = len(tokens)
                tokens.append(int(tok))
                parents.append(mp)
                cond.append(c)
                raw.append(_conditional(raw_probs, p, i))
                origins.append(origin)
            elif c > cond[j]:
                cond[j], raw[j], origins[j] = c, _conditional(raw_probs, p, i), origin
            mapped.append(j)
    probs = [0.0] * len(tokens)
    for j in range(len(tokens)):  # topological: both sources are, and parents come first
        probs[j] = cond[j] * (1.0 if parents[j] < 0 else probs[parents[j]])
    keep = sorted(sorted(range(len(tokens)), key=lambda j: (-probs[j], j))[:budget])
    new = {j: n for n, j in enumerate(keep)}
    out_probs: list[float] = []
    out_parents: list[int] = []
    for j in keep:
        up = parents[j]
        out_parents.append(-1 if up < 0 else new[up])
        out_probs.append(raw[j] * (1.0 if up < 0 else out_probs[new[up]]))
    return DraftTree(
        tokens=[tokens[j] for j in keep],
        parents=out_parents,
        probs=out_probs,
        score=float(sum(out_probs)),
        match_len=suffix.match_len,
        origins=[origins[j] for j in keep],
    )


def _conditional(path_probs: Sequence[float], parent: int, i: int) -> float:
    up = 1.0 if parent < 0 else path_probs[parent]
    return min(1.0, float(path_probs[i]) / up) if up > 0 else 0.0
