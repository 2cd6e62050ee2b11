"""The drafter's output: a tree of proposed tokens below the last committed token."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Node origins: the suffix trees; a grammar's forced continuation; one of a grammar's few
#: admitted continuations (``suffix/grammar.py``); the target's own top-k, recycled
#: (``suffix/recycling.py``). The draft gate calibrates each apart.
SUFFIX_NODE, FORCED_NODE, ALTERNATIVE_NODE, RECYCLED_NODE = 0, 1, 2, 3
ORIGINS = 4


@dataclass(slots=True)
class DraftTree:
    """Draft nodes in topological order (a node's parent comes before it).

    tokens: proposed token ids; the tree's root, the last committed token, is not
        included.
    parents: parents[i] < i is the index of node i's parent, -1 for a child of the root.
    probs: path probability of each node (estimated chance it is accepted).
    score: sum of probs, the expected number of accepted draft tokens.
    match_len: length of the matched context suffix the draft came from (0 when
        the draft is empty).
    origins: per node, where it came from (:data:`SUFFIX_NODE`, :data:`FORCED_NODE`,
        :data:`ALTERNATIVE_NODE`, :data:`RECYCLED_NODE`); empty: every node from the suffix
        trees.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0
    origins: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def first(self, cap: int | None) -> DraftTree:
        """The tree cut to its first ``cap`` nodes: the drafter adds nodes best first (by
        path probability) in topological order, so a prefix is the best valid tree of
        that size. The tree itself when uncapped or small enough."""
        if cap is None or len(self.tokens) <= cap:
            return self
        probs = list(self.probs[:cap])
        return DraftTree(
            tokens=list(self.tokens[:cap]),
            parents=list(self.parents[:cap]),
            probs=probs,
            score=float(sum(probs)),
            match_len=self.match_len if cap else 0,
            origins=list(self.origins[:cap]),
        )
