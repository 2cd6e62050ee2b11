"""The drafter's output: a tree of proposed tokens below the last committed token."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0

    def __len__(self) -> int:
        return len(self.tokens)
