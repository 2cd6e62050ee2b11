"""Grammar-aware drafts: a draft tree checked against a request's structured-output grammar,
and the grammar's forced continuation drafted where the tree has nothing.

Under a JSON schema, a regex or a tool-call format much of the output is forced (property
names, quotes, braces, separators, enum values). The host's verify already walks each draft
tree with the request's grammar and rejects what breaks it; this module does the same walk
*before* verify on a copy of the grammar state (a :class:`GrammarCursor`), so that

* a branch is cut at its first token the grammar rejects, and the verify slots it held go
  to the next-best nodes of the drafter's (larger) candidate tree;
* where the grammar admits exactly one continuation (its jump-forward string), those tokens
  are drafted below the tree's most likely path, even when no suffix tree has them,
  tokenised as the target emitted that string before (:class:`ForcedTokenizer` learns it
  from committed outputs), else by the model's tokenizer, else by longest vocabulary match.

Nothing here changes what the target commits: the drafts go through the host's verify,
which applies the grammar itself. The work is bounded (a node budget per request, a time
budget per step; past it a request keeps its unshaped draft). Engine-agnostic: the serving
side (``sglang/workers/suffix_grammar.py``) adapts the host's xgrammar matcher.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .draft import ALTERNATIVE_NODE, FORCED_NODE, SUFFIX_NODE, DraftTree
from .forced_tokens import ForcedTokenizer

#: Path probability given to each forced node relative to its parent: the grammar admits
#: only this string, but the target may tokenise it otherwise (then the node is rejected).
FORCED_PROB = 0.9
#: Alternatives: where the grammar admits at most this many next tokens and they spell at
#: most :data:`ALT_MAX` distinct continuations (an enum's values, ``true``/``false``, one of
#: a few property names), each continuation is drafted as a branch of its own.
ALT_MAX_TOKENS = 48
ALT_MAX = 4


class GrammarCursor(Protocol):
    """A private copy of a request's grammar state, positioned after its committed tokens."""

    def accept(self, token: int) -> bool:
        """Advance by ``token`` if the grammar admits it; False (unchanged) if not."""

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens."""

    def forced_string(self) -> str:
        """The longest string every continuation from here starts with ('' if none)."""

    def forced_stop(self) -> int | None:
        """The stop token when it is the only token the grammar admits here, else None."""

    # optional (alternatives): ``next_tokens(limit) -> list[int] | None``, the tokens the
    # grammar admits here when at most ``limit``, else None


@dataclass
class ShapeStats:
    """What shaping did to the drafts of grammar requests (cumulative)."""

    requests: int = 0  # request-steps shaped
    cut: int = 0  # draft nodes the grammar rejected
    forced: int = 0  # forced nodes drafted
    forced_learned: int = 0  # ... of them from a learned tokenisation
    branched: int = 0  # request-steps where the grammar's alternatives were drafted
    alt_nodes: int = 0  # nodes drafted from those alternatives
    over_budget: int = 0  # request-steps left unshaped: the step's time budget was spent
    faults: int = 0  # request-steps left unshaped: the cursor raised

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _children(parents: Sequence[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]  # slot 0: the root
    for i, p in enumerate(parents):
        kids[p + 1].append(i)
    return kids


def prune(tree: DraftTree, cursor: GrammarCursor) -> tuple[list[int], int]:
    """Indices of ``tree``'s nodes the grammar admits along their path (topological
    order), and how many were cut. The cursor is back where it started on return."""
    kids = _children(tree.parents)
    kept: list[int] = []

    def visit(node: int) -> None:
        for child in kids[node + 1]:
            if cursor.accept(tree.tokens[child]):
                kept.append(child)
                try:
                    visit(child)
                finally:
                    cursor.rollback(1)

    visit(-1)
    kept.sort()
    return kept, len(tree.tokens) - len(kept)


def _spine(tree: DraftTree, kept: list[int]) -> list[int]:
    """The most likely root-to-leaf path through the kept nodes."""
    keep = set(kept)
    kids = _children(tree.parents)
    path, node = [], -1
    while True:
        options = [c for c in kids[node + 1] if c in keep]
        if not options:
            return path
        node = max(options, key=lambda c: (tree.probs[c] if c < len(tree.probs) else 0.0, -c))
        path.append(node)


def forced_chain(
    cursor: GrammarCursor, tokenizer: ForcedTokenizer, budget: int
) -> tuple[list[int], int]:
    """Up to ``budget`` tokens the grammar forces from the cursor's state (each checked
    with the cursor), and how many came from a learned tokenisation. Cursor restored."""
    chain: list[int] = []
    learned = 0
    try:
        while len(chain) < budget:
            s = cursor.forced_string()
            if not s:
                stop = cursor.forced_stop()
                if stop is not None and cursor.accept(stop):
                    chain.append(stop)
                break
            from_memory = tokenizer.learned(s) is not None
            toks = tokenizer.tokens(s)
            took = 0
            for tok in toks[: budget - len(chain)]:
                if not cursor.accept(tok):
                    break
                chain.append(tok)
                took += 1
            if from_memory:
                learned += took
            if not toks or took < len(toks):  # untokenisable, budget, or refused: stop
                break
    finally:
        if chain:
            cursor.rollback(len(chain))
    return chain, learned


def alternatives(
    cursor: GrammarCursor,
    tokenizer: ForcedTokenizer,
    budget: int,
    max_tokens: int = ALT_MAX_TOKENS,
    max_alts: int = ALT_MAX,
) -> list[list[int]]:
    """Where the grammar forces nothing but admits few continuations (an enum's values,
    ``true``/``false``): each of them as tokens (its spelling up to where the grammar
    forces no more, tokenised as :meth:`ForcedTokenizer.tokens` does, then the forced
    chain after it), at most ``budget`` tokens each; [] where the grammar admits more
    than ``max_tokens`` tokens or ``max_alts`` continuations. Cursor restored."""
    ask = getattr(cursor, "next_tokens", None)
    if ask is None or tokenizer.vocab is None or budget <= 0:
        return []
    firsts = ask(max_tokens)
    if not firsts:
        return []
    spelled: dict[str, None] = {}
    for tok in firsts:
        piece = tokenizer.piece(tok)
        if not piece or not cursor.accept(tok):
            continue
        try:
            rest = cursor.forced_string()
        finally:
            cursor.rollback(1)
        spelled.setdefault(piece + rest, None)
    # a spelling that another extends is no continuation of its own ("se" of "search"
    # and "send": the grammar forced nothing after it)
    texts = [t for t in spelled if not any(o != t and o.startswith(t) for o in spelled)]
    if len(texts) > max_alts:
        return []
    out: list[list[int]] = []
    for text in texts:
        toks = tokenizer.tokens(text)[:budget]
        took = 0
        try:
            for tok in toks:
                if not cursor.accept(tok):
                    break
                took += 1
            after: list[int] = []
            if took and took == len(toks) and took < budget:
                after, _ = forced_chain(cursor, tokenizer, budget - took)
        finally:
            if took:
                cursor.rollback(took)
        if took:
            out.append(list(toks[:took]) + after)
    return out


def shape(
    tree: DraftTree,
    cursor: GrammarCursor,
    max_nodes: int,
    tokenizer: ForcedTokenizer,
    stats: ShapeStats | None = None,
    forced_prob: float = FORCED_PROB,
) -> DraftTree:
    """``tree`` cut to what the grammar admits, with the forced continuation below its most
    likely path, keeping the ``max_nodes`` most likely nodes (a parent before its child).
    ``tree`` may hold more than ``max_nodes`` candidates. The cursor is left unchanged."""
    stats = stats if stats is not None else ShapeStats()
    probs = list(tree.probs) + [0.0] * (len(tree.tokens) - len(tree.probs))
    kept, cut = prune(tree, cursor)
    spine = _spine(tree, kept)
    accepted = 0
    try:
        for node in spine:
            if not cursor.accept(tree.tokens[node]):  # prune admitted it: cannot happen
                raise RuntimeError("grammar cursor disagrees with itself")
            accepted += 1
        chain, learned = forced_chain(cursor, tokenizer, max_nodes)
        alts: list[list[int]] = []
        room = max_nodes - len(chain)
        if room > 0 and not (chain and chain[-1] in _stops(cursor)):
            for tok in chain:
                cursor.accept(tok)
            accepted += len(chain)
            alts = alternatives(cursor, tokenizer, room)
    finally:
        if accepted:
            cursor.rollback(accepted)
    # candidates: kept nodes, then the forced chain under the spine's leaf
    new_index = {old: i for i, old in enumerate(kept)}
    tokens = [tree.tokens[i] for i in kept]
    parents = [new_index[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in kept]
    cand_probs = [probs[i] for i in kept]
    origins = [tree.origins[i] if tree.origins else SUFFIX_NODE for i in kept]
    parent = new_index[spine[-1]] if spine else -1
    p = probs[spine[-1]] if spine else 1.0
    for tok in chain:
        p *= forced_prob
        tokens.append(tok)
        parents.append(parent)
        cand_probs.append(p)
        origins.append(FORCED_NODE)
        parent = len(tokens) - 1
    n_chain_end = len(tokens)
    # then the alternatives under the chain's end, as a trie (shared prefixes once), each
    # branch's share of the path probability as its count of alternatives through it
    trie: dict[tuple[int, int], int] = {}  # (parent index, token) -> index
    through: list[int] = []
    for alt in alts:
        at = parent
        for depth, tok in enumerate(alt):
            key = (at, tok)
            node = trie.get(key)
            if node is None:
                node = trie[key] = len(tokens)
                tokens.append(tok)
                parents.append(at)
                cand_probs.append(0.0)
                origins.append(ALTERNATIVE_NODE)
                through.append(0)
            through[node - n_chain_end] += 1
            cand_probs[node] = (
                p * (forced_prob ** (depth + 1)) * through[node - n_chain_end] / len(alts)
            )
            at = node
    # the max_nodes most likely; path probabilities never grow along a path, and a parent
    # precedes its children, so (prob desc, index asc) keeps every chosen node's parent
    order = sorted(range(len(tokens)), key=lambda i: (-cand_probs[i], i))[:max_nodes]
    chosen = sorted(order)
    remap = {old: i for i, old in enumerate(chosen)}
    out = DraftTree(
        tokens=[tokens[i] for i in chosen],
        parents=[remap[parents[i]] if parents[i] >= 0 else -1 for i in chosen],
        probs=[cand_probs[i] for i in chosen],
        match_len=tree.match_len,
        origins=[origins[i] for i in chosen],
    )
    out.score = float(sum(out.probs))
    n_forced = sum(1 for i in chosen if len(kept) <= i < n_chain_end)
    n_alt = sum(1 for i in chosen if i >= n_chain_end)
    stats.requests += 1
    stats.branched += bool(n_alt)
    stats.alt_nodes += n_alt
    stats.cut += cut
    stats.forced += n_forced
    stats.forced_learned += min(learned, n_forced)
    return out


def _stops(cursor: GrammarCursor) -> tuple[int, ...]:
    return tuple(getattr(cursor, "stop_ids", ()) or ())


#: Candidate nodes asked of the drafter per verify slot for a grammar request.
CANDIDATES_PER_SLOT = 2


@dataclass
class StepBudget:
    """The time one step may spend shaping drafts (seconds, from the first request)."""

    seconds: float
    started: float = field(default_factory=time.perf_counter)

    def spent(self) -> bool:
        return time.perf_counter() - self.started > self.seconds
