"""xgrammar for grammar-aware drafts (``grammar.py`` does the tree work): a cursor over a
fork of a request's matcher, and the layout companions of JSON-schema requests.

Engine-agnostic: xgrammar and duck-typed requests only (``rid``, ``output_ids``,
``grammar.matcher``, ``grammar.ctx.tokenizer_info``, ``sampling_params.json_schema``, as
the host's ``Req`` has them), so the serving worker (``sglang/workers/suffix_grammar.py``)
and the offline replay (``replay/grammar.py``) share them.

Layout companions: the host compiles a ``json_schema`` request's grammar with optional
whitespace between any two tokens, so it forces almost nothing. The same schema compiled
without optional whitespace, in each layout a target may write (one line; indented by 2;
by 4), and fed the request's committed tokens, tells which layout the output follows; the
first layout still standing supplies the forced string (newlines and indentation,
separators, property names) where the request's own grammar has none.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

#: Requests whose layout matchers are kept (oldest dropped first).
REQUEST_BOUND = 4096


class XGrammarCursor:
    """``suffix.grammar.GrammarCursor`` over a fork of the request's xgrammar matcher.

    ``style``: optionally a fork of a second matcher for the same JSON schema compiled
    without optional whitespace in the layout the output follows (``StyleMatchers``), at
    the same committed tokens. Where
    the request's grammar forces nothing only because whitespace could follow, the layout
    grammar's forced string is offered instead: the separators the target writes
    (``'": "'``, ``'", "'``) and the property names after them. Every token is still
    checked against the request's own grammar; once the layout's grammar refuses a token on
    a path it stays silent below it."""

    def __init__(
        self,
        matcher: Any,
        stop_ids: list[int],
        style: Any | None = None,
        vocab_size: int | None = None,
    ) -> None:
        self.m = matcher.fork()
        self.stop_ids = stop_ids
        self.vocab_size = vocab_size
        self.s = style.fork() if style is not None else None
        self._path: list[bool] = []  # per accepted token: did the style matcher take it too
        self._style_off = 0  # accepted tokens on the path the style matcher did not take

    def accept(self, token: int) -> bool:
        if not self.m.accept_token(int(token)):
            return False
        both = self.s is not None and not self._style_off and bool(self.s.accept_token(int(token)))
        self._path.append(both)
        self._style_off += not both
        return True

    def rollback(self, n: int) -> None:
        self.m.rollback(int(n))
        for _ in range(int(n)):
            both = self._path.pop()
            if both:
                self.s.rollback(1)
            else:
                self._style_off -= 1

    def forced_string(self) -> str:
        if self.m.is_terminated():  # past the stop token xgrammar refuses the question
            return ""
        forced = self.m.find_jump_forward_string()
        if self.s is None or self._style_off or self.s.is_terminated():
            return forced
        # the layout's string where it goes further ('"' of a key: the layout knows '": '
        # follows, and the target writes '":' as one token)
        styled = self.s.find_jump_forward_string()
        return styled if len(styled) > len(forced) and styled.startswith(forced) else forced

    def next_tokens(self, limit: int) -> list[int] | None:
        """The tokens the grammar admits here (the layout's where it still speaks), when at
        most ``limit`` (xgrammar's bitmask, read word by word), else None."""
        if self.vocab_size is None or self.m.is_terminated():
            return None
        g = self.s if self.s is not None and not self._style_off else self.m
        if g.is_terminated():
            g = self.m
        words = _bitmask(self.vocab_size)
        g.fill_next_token_bitmask(words)
        row = words.numpy()[0]
        nonzero = np.flatnonzero(row)
        if len(nonzero) > limit:  # each nonzero word holds at least one token
            return None
        out: list[int] = []
        for w in nonzero.tolist():
            bits = int(row[w]) & 0xFFFFFFFF
            while bits:
                low = bits & -bits
                tok = w * 32 + low.bit_length() - 1
                if tok < self.vocab_size and tok not in self.stop_ids:
                    out.append(tok)
                bits ^= low
            if len(out) > limit:
                return None
        return out

    def forced_stop(self) -> int | None:
        # complete and nothing may follow: only a stop token (a one-token check each)
        if not self.m.is_completed() or self.m.is_terminated():
            return None
        for stop in self.stop_ids:
            if self.m.accept_token(stop):
                self.m.rollback(1)
                return stop
        return None


_BITMASKS: dict[int, Any] = {}


def _bitmask(vocab_size: int) -> Any:
    """One reusable xgrammar token bitmask per vocabulary size (the drafting thread only)."""
    mask = _BITMASKS.get(vocab_size)
    if mask is None:
        import xgrammar as xg

        mask = _BITMASKS[vocab_size] = xg.allocate_token_bitmask(1, vocab_size)
    return mask


def committed_tail(req: Any, prev: list[int], start: int) -> list[int]:
    """``req``'s committed tokens from position ``start`` of its output: ``req.output_ids``
    then ``prev``, the previous step's tokens it does not hold yet (overlap relay)."""
    out = req.output_ids
    n = len(out)
    if start >= n:
        return list(prev[start - n :])
    return list(out[start:]) + list(prev)


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
