"""What replay needs from a drafter, and greedy acceptance along a draft tree.

A draft is any object with ``tokens`` (the draft nodes, root excluded) and
``parents`` (``parents[i]`` is the index of node ``i``'s parent among the draft
nodes, or -1 when the parent is the root, i.e. the last committed token; parents
precede their children). ``sglang_spec_ext.suffix.DraftTree`` and this module's
``Draft`` both fit.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@runtime_checkable
class DraftLike(Protocol):
    @property
    def tokens(self) -> Sequence[int]: ...

    @property
    def parents(self) -> Sequence[int]: ...


@dataclass
class Draft:
    """A minimal draft tree (chains have ``parents == [-1, 0, 1, ...]``)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    @staticmethod
    def chain(tokens: Sequence[int]) -> Draft:
        return Draft(list(tokens), list(range(-1, len(tokens) - 1)))


@runtime_checkable
class Drafter(Protocol):
    """A model-free drafter as the serving path drives it.

    ``extend_request`` appends committed tokens (the first output token from
    prefill, then the accepted tokens plus the bonus of each step).
    ``speculate`` must not change the drafter's state.
    """

    def start_request(self, req_id: Hashable, prompt_ids: Sequence[int]) -> None: ...

    def extend_request(self, req_id: Hashable, token_ids: Sequence[int]) -> None: ...

    def speculate(self, req_id: Hashable, max_nodes: int) -> DraftLike: ...

    def finish_request(self, req_id: Hashable) -> None: ...


def draft_tokens(draft: DraftLike | None) -> Sequence[int]:
    return () if draft is None else draft.tokens


def validate_draft(draft: DraftLike, max_nodes: int | None = None) -> None:
    """Raise ``ValueError`` unless ``draft`` is a well-formed tree within budget."""
    tokens, parents = draft.tokens, draft.parents
    if len(tokens) != len(parents):
        raise ValueError(f"draft has {len(tokens)} tokens but {len(parents)} parents")
    if max_nodes is not None and len(tokens) > max_nodes:
        raise ValueError(f"draft has {len(tokens)} nodes, budget {max_nodes}")
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"draft node {i} has parent {p}; parents must precede children")


def node_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each draft node (children of the root have depth 1)."""
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths


def greedy_accept(draft: DraftLike | None, continuation: Sequence[int]) -> int:
    """Number of draft tokens a greedy verifier accepts (bonus excluded).

    Walks from the root: at depth ``d`` it moves to a child whose token equals
    ``continuation[d]`` (the first such child in node order) and stops when there
    is none or the continuation is exhausted.
    """
    if draft is None or not draft.tokens or not continuation:
        return 0
    tokens, parents = draft.tokens, draft.parents
    node = -1
    accepted = 0
    limit = len(continuation)
    start = 0
    while accepted < limit:
        want = continuation[accepted]
        nxt = -1
        for i in range(start, len(tokens)):
            if parents[i] == node and tokens[i] == want:
                nxt = i
                break
        if nxt < 0:
            break
        node = nxt
        start = nxt + 1  # children come after their parent
        accepted += 1
    return accepted


def tree_from_ancestor_mask(tokens: Sequence[int], mask: Sequence[Sequence[int]]) -> Draft:
    """Draft from a host-style layout: ``tokens[0]`` is the root (last committed
    token) and ``mask[i][j] == 1`` iff node ``j`` is an ancestor of ``i`` or ``i`` itself.

    A node's parent is its deepest proper ancestor (the one with the most ancestors).
    """
    import numpy as np

    toks = np.asarray(tokens).reshape(-1)
    width = toks.shape[0]
    m = np.asarray(mask, dtype=bool).reshape(width, width)
    if width <= 1:
        return Draft()
    depth = m.sum(axis=1)
    strict = np.tril(m, k=-1)  # proper ancestors (parents precede children)
    score = np.where(strict, depth[None, :], -1)
    parent = score.argmax(axis=1)  # index of the deepest proper ancestor
    return Draft([int(t) for t in toks[1:]], [int(p) - 1 for p in parent[1:]])


def truncate_draft(draft: DraftLike, max_nodes: int) -> Draft:
    """The first ``max_nodes`` nodes (a valid tree, since parents precede children)."""
    return Draft(list(draft.tokens[:max_nodes]), list(draft.parents[:max_nodes]))
