"""Layout companions for JSON-schema requests (grammar-aware drafts, ``suffix_grammar.py``).

The host compiles a ``json_schema`` request's grammar with optional whitespace between any
two tokens, so it forces almost nothing. The same schema compiled without optional
whitespace, in each layout a target may write (one line; indented by 2; by 4), and fed the
request's committed tokens, tells which layout the output follows; the first layout still
standing supplies the forced string (newlines and indentation, separators, property names)
where the request's own grammar has none.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from sglang_spec_ext.sglang.workers.suffix_relay import committed_tail

#: Requests whose layout matchers are kept (oldest dropped first).
REQUEST_BOUND = 4096


#: The layouts a target may write JSON in (xgrammar's ``indent``; None: one line with
#: ``", "`` and ``": "`` separators), tried side by side until the output picks one.
STYLES: tuple[int | None, ...] = (None, 2, 4)


class StyleMatchers:
    """Per JSON-schema request, matchers of the same schema compiled without optional
    whitespace in each layout of :data:`STYLES` (one line; indented by 2 or 4), kept at the
    request's committed tokens (fed as they commit); a layout the output leaves (its
    grammar refuses a committed token) is dropped, and the first one still standing is
    offered. Compiled grammars: bounded LRU by (schema, layout); matchers: bounded,
    dropped with their request."""

    def __init__(self, compiled_bound: int = 64, request_bound: int = REQUEST_BOUND) -> None:
        self._compiled: OrderedDict[tuple[str, int | None], Any] = OrderedDict()
        self._compiler: Any = None
        self._by_rid: OrderedDict[str, list] = OrderedDict()  # rid -> [[matcher | None...], fed]
        self.compiled_bound = compiled_bound
        self.request_bound = request_bound
        self.left_style = 0  # requests whose output left every layout

    def of(self, req: Any, prev: list[int] = ()) -> Any | None:
        """The first layout matcher still standing at ``req``'s committed tokens
        (``prev``: its relayed tokens), or None."""
        schema = getattr(getattr(req, "sampling_params", None), "json_schema", None)
        if not schema:
            return None
        entry = self._by_rid.get(req.rid)
        if entry is None:
            import xgrammar as xg

            info = req.grammar.ctx.tokenizer_info
            entry = [
                [xg.GrammarMatcher(self._compile(schema, indent, info)) for indent in STYLES],
                0,
            ]
            self._by_rid[req.rid] = entry
            while len(self._by_rid) > self.request_bound:
                self._by_rid.popitem(last=False)
        matchers, fed = entry
        if not any(m is not None for m in matchers):
            return None
        new = committed_tail(req, prev, fed)
        for i, m in enumerate(matchers):
            if m is not None and not all(
                not m.is_terminated() and m.accept_token(int(t)) for t in new
            ):
                matchers[i] = None
        entry[1] = len(req.output_ids) + len(prev)
        alive = [m for m in matchers if m is not None]
        if not alive:
            self.left_style += 1
            return None
        return alive[0]

    def forget(self, rids: list[str]) -> None:
        for rid in rids:
            self._by_rid.pop(rid, None)

    def disable(self, rid: str) -> None:
        """No companion for ``rid`` (its schema did not compile, say)."""
        self._by_rid[rid] = [[None], 0]
        while len(self._by_rid) > self.request_bound:
            self._by_rid.popitem(last=False)

    def _compile(self, schema: str, indent: int | None, tokenizer_info: Any) -> Any:
        key = (schema, indent)
        hit = self._compiled.get(key)
        if hit is not None:
            self._compiled.move_to_end(key)
            return hit
        import xgrammar as xg

        if self._compiler is None:
            self._compiler = xg.GrammarCompiler(tokenizer_info)
        compiled = self._compiler.compile_json_schema(schema, any_whitespace=False, indent=indent)
        self._compiled[key] = compiled
        while len(self._compiled) > self.compiled_bound:
            self._compiled.popitem(last=False)
        return compiled
