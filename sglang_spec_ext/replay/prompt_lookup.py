"""Plain prompt-lookup drafting: the baseline every model-free method must beat.

Matches the last n tokens of the request's own context (prompt + output so far),
n from ``max_ngram`` down to ``min_ngram``, at their most recent earlier
occurrence, and proposes the tokens that followed it as a chain. No state is
shared between requests.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from sglang_spec_ext.replay.protocol import Draft


@dataclass
class _Context:
    tokens: list[int] = field(default_factory=list)
    # n -> {n-gram: index of the token that followed its latest occurrence}
    follow: dict[int, dict[tuple[int, ...], int]] = field(default_factory=dict)


class PromptLookupDrafter:
    """Chain drafts from n-gram matches within the request itself (n = 3..1)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._reqs: dict[Hashable, _Context] = {}

    def start_request(self, req_id: Hashable, prompt_ids: Sequence[int]) -> None:
        if req_id in self._reqs:
            raise ValueError(f"request {req_id!r} already started")
        ctx = _Context(follow={n: {} for n in range(self.min_ngram, self.max_ngram + 1)})
        self._reqs[req_id] = ctx
        self._append(ctx, prompt_ids)

    def extend_request(self, req_id: Hashable, token_ids: Sequence[int]) -> None:
        self._append(self._reqs[req_id], token_ids)

    def finish_request(self, req_id: Hashable) -> None:
        self._reqs.pop(req_id, None)

    def _append(self, ctx: _Context, token_ids: Sequence[int]) -> None:
        toks = ctx.tokens
        for tok in token_ids:
            pos = len(toks)  # index the new token will have
            # Every n-gram ending just before `pos` is now followed by `tok`.
            for n, table in ctx.follow.items():
                if pos >= n:
                    table[tuple(toks[pos - n : pos])] = pos
            toks.append(int(tok))

    def speculate(self, req_id: Hashable, max_nodes: int) -> Draft:
        ctx = self._reqs[req_id]
        toks = ctx.tokens
        if max_nodes <= 0:
            return Draft()
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(toks) < n:
                continue
            start = ctx.follow[n].get(tuple(toks[-n:]))
            if start is not None:
                return Draft.chain(toks[start : start + max_nodes])
        return Draft()
