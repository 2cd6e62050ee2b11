"""Grammar-aware drafts in the offline replay (``simulate --tokenizer``).

A trace record may carry the request's structured-output constraint (``"constraint":
{"json_schema": ...}``, ``{"regex": ...}`` or ``{"ebnf": ...}``, as the host's sampling
parameters spell them). :class:`GrammarShaped` wraps a replay drafter and shapes its drafts
as SUFFIX serving does (``suffix/grammar.py``): the inner drafter is asked for
``CANDIDATES_PER_SLOT`` times the slots, the tree is checked against an xgrammar matcher of
the request's constraint at its committed tokens, rejected branches are cut, the grammar's
forced continuation and its few alternatives are drafted (with the layout companions of a
JSON schema, ``suffix/xgrammar_cursor.py``), forced strings are tokenised as the target
committed them before. Under greedy decoding the output does not depend on the drafts, so
accept lengths are exact for this drafting, as every replay; serving's draft gate (which
trims drafts for their verify cost) is not replayed.

Needs the served model's tokenizer (``--tokenizer``: a local path) and xgrammar; a trace
output that its own constraint rejects is a clear error (the trace and the constraint do
not belong together).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from sglang_spec_ext.replay.protocol import Drafter, DraftLike
from sglang_spec_ext.replay.trace import TraceRecord
from sglang_spec_ext.suffix.forced_tokens import ForcedTokenizer, PendingForced
from sglang_spec_ext.suffix.grammar import (
    CANDIDATES_PER_SLOT,
    ShapeStats,
    shape,
)
from sglang_spec_ext.suffix.xgrammar_cursor import StyleMatchers, XGrammarCursor

#: Compiled constraints kept (least recently used dropped first).
COMPILED_BOUND = 64


class GrammarShaped:
    """A replay drafter whose drafts for constrained requests are shaped by their grammar
    (see the module doc); unconstrained requests keep the inner drafter's drafts."""

    def __init__(self, inner: Drafter, tokenizer_path: str) -> None:
        try:
            import xgrammar as xg
            from transformers import AutoTokenizer
        except ImportError as exc:  # pragma: no cover - both ship with the package's deps
            raise ValueError(f"grammar replay needs xgrammar and transformers: {exc}") from exc
        try:
            tok = AutoTokenizer.from_pretrained(tokenizer_path)
        except Exception as exc:  # noqa: BLE001 - say which flag
            raise ValueError(f"--tokenizer {tokenizer_path!r}: cannot load it ({exc})") from exc
        self._xg = xg
        self.inner = inner
        self.info = xg.TokenizerInfo.from_huggingface(tok)
        self._compiler = xg.GrammarCompiler(self.info)
        self.tokenizer = ForcedTokenizer(
            list(self.info.decoded_vocab), encode=lambda s: tok.encode(s, add_special_tokens=False)
        )
        self.stats = ShapeStats()
        self.style = StyleMatchers()
        self.pending = PendingForced()
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._constraints: dict[Hashable, Mapping[str, str]] = {}
        self._reqs: dict[Hashable, Any] = {}

    # -- what the engine calls ---------------------------------------------------------
    def prepare(self, req_id: Hashable, rec: TraceRecord) -> None:
        """Before ``start_request``: the request's constraint, if any (and the inner
        drafter's own ``prepare``, e.g. the recycled top-k's: ``replay/recycle.py``)."""
        inner_prepare = getattr(self.inner, "prepare", None)
        if inner_prepare is not None:
            inner_prepare(req_id, rec)
        if rec.constraint:
            self._constraints[req_id] = rec.constraint

    def start_request(self, req_id: Hashable, prompt_ids: Sequence[int]) -> None:
        self.inner.start_request(req_id, prompt_ids)
        constraint = self._constraints.pop(req_id, None)
        if constraint is None:
            return
        matcher = self._xg.GrammarMatcher(self._compile(constraint))
        grammar = SimpleNamespace(matcher=matcher, ctx=SimpleNamespace(tokenizer_info=self.info))
        params = SimpleNamespace(json_schema=constraint.get("json_schema"))
        self._reqs[req_id] = SimpleNamespace(
            rid=req_id, output_ids=[], grammar=grammar, sampling_params=params
        )

    def extend_request(self, req_id: Hashable, token_ids: Sequence[int]) -> None:
        self.inner.extend_request(req_id, token_ids)
        req = self._reqs.get(req_id)
        if req is None:
            return
        matcher = req.grammar.matcher
        for i, tok in enumerate(token_ids):
            if matcher.is_terminated():
                break
            if not matcher.accept_token(int(tok)):
                at = len(req.output_ids) + i
                raise ValueError(
                    f"request {req_id}: output token {tok} at position {at} breaks the "
                    "record's constraint (the trace and its constraint do not belong together)"
                )
        req.output_ids.extend(int(t) for t in token_ids)

    def speculate(self, req_id: Hashable, max_nodes: int) -> DraftLike:
        req = self._reqs.get(req_id)
        if req is None or req.grammar.matcher.is_terminated():
            return self.inner.speculate(req_id, max_nodes)
        tree = self.inner.speculate(req_id, max_nodes * CANDIDATES_PER_SLOT)
        out = req.output_ids
        self.pending.learn(req_id, self.tokenizer, lambda start: out[start:])
        matcher = req.grammar.matcher
        stops = [int(t) for t in matcher.stop_token_ids]
        cursor = XGrammarCursor(matcher, stops, self.style.of(req), self.info.vocab_size)
        shaped = shape(_as_tree(tree), cursor, max_nodes, self.tokenizer, self.stats)
        self.pending.remember(req_id, len(out), cursor.forced_string())
        return shaped

    def finish_request(self, req_id: Hashable) -> None:
        self.inner.finish_request(req_id)
        self._reqs.pop(req_id, None)
        self._constraints.pop(req_id, None)
        self.style.forget([req_id])
        self.pending.forget(req_id)

    # -- helpers -----------------------------------------------------------------------
    def _compile(self, constraint: Mapping[str, str]) -> Any:
        kind, text = next(iter(constraint.items()))
        key = f"{kind}:{text}"
        hit = self._compiled.get(key)
        if hit is not None:
            self._compiled.move_to_end(key)
            return hit
        if kind == "json_schema":
            compiled = self._compiler.compile_json_schema(text)
        elif kind == "regex":
            compiled = self._compiler.compile_regex(text)
        else:
            compiled = self._compiler.compile_grammar(text)
        self._compiled[key] = compiled
        while len(self._compiled) > COMPILED_BOUND:
            self._compiled.popitem(last=False)
        return compiled


def _as_tree(draft: DraftLike) -> Any:
    """The inner drafter's draft as a ``DraftTree`` (drafters without probabilities rank
    their nodes in order)."""
    from sglang_spec_ext.suffix.draft import DraftTree

    if isinstance(draft, DraftTree):
        return draft
    n = len(draft.tokens)
    probs = list(getattr(draft, "probs", None) or [1.0 - i / (n + 1) for i in range(n)])
    return DraftTree(list(draft.tokens), list(draft.parents), probs, float(sum(probs)), n)
