"""Draft nodes' acceptance, learned from what requests commit (ragged verify's gate).

Engine-agnostic. :class:`NodeCalibration` turns the drafter's probabilities into the
chance each draft node is accepted (``suffix/lengths.py`` chooses the nodes a step
verifies from it). Every step calibrates the batch's drafts and labels the drafts of the
step before with what their requests committed, so both run over a whole batch at once
(one set of arrays for all its nodes, a few array operations per tree depth), not a
Python loop over each node of each draft: at batch 64 and width 16 that loop was most of
SUFFIX's host time per decode step outside the drafter.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .draft import ORIGINS, RECYCLED_NODE, SUFFIX_NODE, DraftTree
from .lengths import MATCH_BUCKETS, match_bucket

#: Bins of the drafter's own path probability that node acceptance is calibrated in.
PROB_BINS = 10


def conditional_probs(tree: DraftTree) -> np.ndarray:
    """Each node's drafter probability given its parent (path probability over the
    parent's; the root's children: their own), in [0, 1]."""
    return _Nodes.of([tree]).cond


@dataclass
class _Nodes:
    """The probable nodes of a batch of draft trees, in order, as flat arrays."""

    counts: np.ndarray  # per tree: its nodes here (those with a probability)
    owner: np.ndarray  # per node: its tree
    parent: np.ndarray  # per node: its parent's flat index (-1: a child of the root)
    tokens: np.ndarray
    cond: np.ndarray  # the drafter's probability given the parent, in [0, 1]
    bucket: np.ndarray  # the match-length bucket of the node's draft
    origin: np.ndarray  # DraftTree.origins (SUFFIX_NODE where a draft has none)

    @classmethod
    def of(cls, trees: Sequence[DraftTree]) -> _Nodes:
        counts = np.fromiter(
            (min(len(t.tokens), len(t.parents), len(t.probs)) for t in trees),
            dtype=np.int64,
            count=len(trees),
        )
        total = int(counts.sum())

        def flat(attr: str, dtype: type) -> np.ndarray:
            values = itertools.chain.from_iterable(
                getattr(t, attr)[:n] for t, n in zip(trees, counts.tolist(), strict=True)
            )
            return np.fromiter(values, dtype=dtype, count=total)

        owner = np.repeat(np.arange(len(trees)), counts)
        local = flat("parents", np.int64)
        parent = np.where(local >= 0, local + (np.cumsum(counts) - counts)[owner], -1)
        probs = np.clip(flat("probs", np.float64), 0.0, 1.0)
        above = np.where(parent >= 0, probs[np.maximum(parent, 0)], 1.0)
        cond = np.where(above > 0, np.minimum(probs / np.maximum(above, 1e-12), 1.0), 0.0)
        origins = itertools.chain.from_iterable(
            t.origins[:n] if t.origins else itertools.repeat(SUFFIX_NODE, n)
            for t, n in zip(trees, counts.tolist(), strict=True)
        )
        buckets = np.fromiter((match_bucket(t.match_len) for t in trees), np.int64, len(trees))
        return cls(counts=counts, owner=owner, parent=parent, tokens=flat("tokens", np.int64),
                   cond=cond, bucket=buckets[owner],
                   origin=np.fromiter(origins, dtype=np.int64, count=total))  # fmt: skip

    def depth(self) -> np.ndarray:
        """Each node's depth below the root (its children: 1)."""
        has, up = self.parent >= 0, np.maximum(self.parent, 0)
        depth = np.ones(self.parent.size, dtype=np.int64)
        while True:  # a fixed point after the deepest level: parents come before children
            nxt = np.where(has, depth[up] + 1, 1)
            if np.array_equal(nxt, depth):
                return depth
            depth = nxt

    def path_product(self, values: np.ndarray) -> np.ndarray:
        """``values`` multiplied along each node's path (itself and its ancestors), in
        the order a walk from the root multiplies them."""
        has, up = self.parent >= 0, np.maximum(self.parent, 0)
        out = values.copy()
        while True:  # the recursion's unique fixed point, reached level by level
            nxt = values * np.where(has, out[up], 1.0)
            if np.array_equal(nxt, out):
                return out
            out = nxt


@dataclass
class NodeCalibration:
    """The chance a draft node is accepted, learned from what requests commit.

    Learned as the chance a node is accepted *given its parent was* (its conditional:
    the drafter's own conditional probability, per probability bin and per match-length
    bucket of its draft), and a node's acceptance is the product along its path. So what
    the shallow nodes of a long repeated match teach applies to its deep ones, which a
    cut draft never shows the target. An observation is every node whose parent is on
    the target's path (or the root) and whose token the committed tokens decide,
    verified or not (accepted, or would have been; or not). A probability bin's pooled
    rate (before evidence, what the drafter says) is the prior of its match-length cells
    (``prior_weight`` pseudo-counts each). Nodes a grammar added (forced continuations,
    alternatives: ``DraftTree.origins``) are learned apart, per origin and probability bin,
    each cell's prior its own probability: the suffix trees' evidence says nothing of them."""

    prior_weight: float = 2.0
    seen: np.ndarray = field(default_factory=lambda: np.zeros(PROB_BINS))
    hits: np.ndarray = field(default_factory=lambda: np.zeros(PROB_BINS))
    cell_seen: np.ndarray = field(default_factory=lambda: np.zeros((MATCH_BUCKETS, PROB_BINS)))
    cell_hits: np.ndarray = field(default_factory=lambda: np.zeros((MATCH_BUCKETS, PROB_BINS)))
    origin_seen: np.ndarray = field(default_factory=lambda: np.zeros((ORIGINS, PROB_BINS)))
    origin_hits: np.ndarray = field(default_factory=lambda: np.zeros((ORIGINS, PROB_BINS)))

    @staticmethod
    def _bins(raw: np.ndarray) -> np.ndarray:
        return np.minimum((np.clip(raw, 0.0, 1.0) * PROB_BINS).astype(np.int64), PROB_BINS - 1)

    def conditional(
        self, raw: np.ndarray, match_len: int | np.ndarray = 0, origins: np.ndarray | None = None
    ) -> np.ndarray:
        """Calibrated chance a node is accepted given its parent was, from the drafter's
        conditional probabilities ``raw`` of a draft matched on ``match_len`` tokens (or,
        an array, each node's match-length bucket; ``origins``: per node, see
        ``DraftTree.origins``)."""
        raw = np.clip(np.asarray(raw, dtype=np.float64), 0.0, 1.0)
        b = self._bins(raw)
        m = match_len if isinstance(match_len, np.ndarray) else match_bucket(match_len)
        w = self.prior_weight
        pooled = (self.hits[b] + w * raw) / (self.seen[b] + w)
        out = (self.cell_hits[m, b] + w * pooled) / (self.cell_seen[m, b] + w)
        if origins is not None:
            other = origins != SUFFIX_NODE
            if other.any():
                o, ob = origins[other], b[other]
                out[other] = (self.origin_hits[o, ob] + w * raw[other]) / (
                    self.origin_seen[o, ob] + w
                )
        return out

    def calibrate(self, tree: DraftTree) -> np.ndarray:
        """Calibrated acceptance probability of each node of ``tree`` (never above its
        parent's: a product of conditionals along the path)."""
        return self.calibrate_many([tree])[0]

    def calibrate_many(self, trees: Sequence[DraftTree]) -> list[np.ndarray]:
        """:meth:`calibrate` of every tree of a batch, over the batch's nodes at once."""
        if not trees:
            return []
        nodes = _Nodes.of(trees)
        cond = self.conditional(nodes.cond, nodes.bucket, nodes.origin)
        return np.split(nodes.path_product(cond), np.cumsum(nodes.counts)[:-1])

    def observe(self, tree: DraftTree, committed: Sequence[int]) -> int:
        """Label ``tree``'s nodes with the tokens its request committed next (the accepted
        drafts and the bonus token of a verify step; one token of a plain step). Returns
        the number of nodes labelled (those whose parent is on the target's path)."""
        return int(self.observe_many([(tree, committed)])[0])

    def observe_many(self, labelled: Sequence[tuple[DraftTree, Sequence[int]]]) -> np.ndarray:
        """:meth:`observe` of every (draft, committed tokens) pair, at once; the number of
        nodes labelled per pair."""
        nodes = _Nodes.of([tree for tree, _ in labelled])
        lens = np.fromiter((len(c) for _, c in labelled), np.int64, len(labelled))
        if nodes.cond.size == 0:
            return np.zeros(len(labelled), dtype=np.int64)
        depth = nodes.depth()
        committed = np.full((len(labelled), max(int(lens.max(initial=0)), 1)), -1, np.int64)
        for i, (_, tokens) in enumerate(labelled):
            committed[i, : len(tokens)] = tokens
        decided = depth <= lens[nodes.owner]  # the committed tokens reach the node's depth
        col = np.minimum(depth - 1, committed.shape[1] - 1)
        match = decided & (committed[nodes.owner, col] == nodes.tokens)
        has, up = nodes.parent >= 0, np.maximum(nodes.parent, 0)
        on_path = np.zeros(depth.size, dtype=bool)
        seen = np.zeros(depth.size, dtype=bool)
        for d in range(1, int(depth.max()) + 1):  # a node's parent is one level up
            level = (depth == d) & decided & (~has | on_path[up])
            seen |= level
            on_path |= level & match
        raw, hit = nodes.cond[seen], on_path[seen].astype(np.float64)
        b, o, m = self._bins(raw), nodes.origin[seen], nodes.bucket[seen]
        mine = o == SUFFIX_NODE
        np.add.at(self.seen, b[mine], 1.0)
        np.add.at(self.hits, b[mine], hit[mine])
        np.add.at(self.cell_seen, (m[mine], b[mine]), 1.0)
        np.add.at(self.cell_hits, (m[mine], b[mine]), hit[mine])
        np.add.at(self.origin_seen, (o[~mine], b[~mine]), 1.0)
        np.add.at(self.origin_hits, (o[~mine], b[~mine]), hit[~mine])
        return np.bincount(nodes.owner[seen], minlength=len(labelled))

    def stats(self) -> dict[str, object]:
        rate = np.where(self.seen > 0, self.hits / np.maximum(self.seen, 1), np.nan)
        seen, hits = self.origin_seen.sum(axis=1), self.origin_hits.sum(axis=1)
        return {"lengths_conditional_acceptance_by_prob_bin": [
            None if np.isnan(r) else round(float(r), 3) for r in rate],
            "lengths_grammar_nodes_seen": [int(x) for x in seen[1:RECYCLED_NODE]],
            "lengths_grammar_nodes_accepted": [int(x) for x in hits[1:RECYCLED_NODE]],
            "lengths_recycled_nodes_seen": int(seen[RECYCLED_NODE]),
            "lengths_recycled_nodes_accepted": int(hits[RECYCLED_NODE])}  # fmt: skip
