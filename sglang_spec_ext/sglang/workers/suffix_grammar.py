"""Grammar-aware SUFFIX drafts on the host (``suffix/grammar.py`` does the tree work).

For a request with a structured-output grammar (``json_schema``, ``regex``, ``ebnf``,
structural tags: ``req.grammar``), the drafter is asked for more candidate nodes than the
verify width holds; the tree is walked with a *fork* of the request's xgrammar matcher
(never the request's own), branches the grammar rejects are cut, the grammar's forced
continuation is drafted below the most likely path, and the most likely ``width - 1``
nodes are kept. The host's verify then applies the grammar as always, so what the target
commits does not change.

When it runs: at draft time a request's matcher must stand at its committed tokens. Under
overlap scheduling those include the previous step's tokens that ``req.output_ids`` does
not hold yet (relayed, ``suffix_relay.py``): SUFFIX calls the host's grammar barrier before
it drafts, so the matcher has accepted them; HYBRID drafts before the host's verify calls
the barrier, so a fork of the matcher is fed them here. With grammar overlap off the host
syncs every grammar batch and nothing is relayed. A request whose matcher is at neither
count is left alone (``grammar_stale_skips``).
Which grammars: the host's xgrammar backend (its default). Another backend's grammar
objects (outlines, llguidance) keep today's drafts, said once in the log.

Under the host's default JSON grammar (optional whitespace between tokens) almost nothing is
forced: whitespace could follow every brace, colon and comma. For a ``json_schema`` request
matchers of the same schema compiled without optional whitespace, one per layout (one line,
indented by 2 or 4), follow the committed tokens (``grammar_layouts.py``) until the output has
picked one; where the request's grammar forces nothing, that layout's forced string
(newlines and indentation, separators, the property names after them) is drafted, each
token still checked against the request's own grammar. A request whose output leaves every
layout stops using them.

Forced strings are tokenised as the target committed them before: each step the forced
string at every grammar request's committed state is remembered with that position, and
at the next step the committed tokens that spell it exactly are learned
(``ForcedTokenizer``, bounded). Bounded per step by ``SGLANG_SPEC_EXT_GRAMMAR_DRAFT_MS``;
past it the remaining requests keep their unshaped drafts.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from sglang_spec_ext.sglang.serving.request_options import cap_tree
from sglang_spec_ext.sglang.workers.grammar_layouts import StyleMatchers
from sglang_spec_ext.sglang.workers.suffix_relay import committed_tail
from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.suffix.grammar import ForcedTokenizer, ShapeStats, StepBudget, shape

logger = logging.getLogger("sglang_spec_ext")

#: Requests whose last forced string is remembered for learning (oldest dropped first).
PENDING_BOUND = 4096
#: Candidate nodes asked of the drafter per verify slot for a grammar request.
CANDIDATES_PER_SLOT = 2


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


def _vocab_size(req: Any) -> int | None:
    try:
        return int(req.grammar.ctx.tokenizer_info.vocab_size)
    except Exception:  # noqa: BLE001 - no alternatives for this request
        return None


def _matcher(req: Any) -> Any | None:
    grammar = getattr(req, "grammar", None)
    matcher = getattr(grammar, "matcher", None)
    if matcher is None or not hasattr(matcher, "fork"):
        return None
    return matcher


class GrammarDrafts:
    """The SUFFIX worker's grammar-aware drafting (see the module doc)."""

    def __init__(self, enabled: bool, budget_ms: float, tokenizer_path: str | None = None) -> None:
        self.enabled = enabled
        self.tokenizer_path = tokenizer_path
        self.budget_s = budget_ms / 1000.0
        self.stats = ShapeStats()
        self.tokenizer: ForcedTokenizer | None = None
        self._pending: dict[str, tuple[int, str]] = {}  # rid -> (committed count, forced)
        self._unsupported: set[str] = set()
        self.skipped_stale = 0
        self.fed_relayed = 0  # matchers forked and fed the relayed tokens (HYBRID, overlap)
        self.barrier_steps = 0  # decode steps whose grammar FSM advanced through the barrier
        self.style = StyleMatchers()
        self.style_faults = 0
        self.steps = 0  # steps that shaped at least one request
        self.shape_s = 0.0  # host seconds those steps spent shaping

    # -- which requests -----------------------------------------------------------------
    def matcher_of(self, req: Any, prev: list[int] = ()) -> Any | None:
        """An xgrammar matcher at the request's committed tokens (``prev``: its relayed
        tokens, overlap) when shaping applies to it, else None: its own matcher, or a fork
        of it fed ``prev`` where the FSM has not advanced over them yet."""
        if not self.enabled or getattr(req, "grammar", None) is None:
            return None
        matcher = _matcher(req)
        if matcher is None:
            kind = type(req.grammar).__name__
            if kind not in self._unsupported:
                self._unsupported.add(kind)
                logger.info(
                    "SUFFIX: grammar-aware drafts support the xgrammar backend only; requests "
                    "with %s grammars keep plain suffix drafts (their output is unchanged)",
                    kind,
                )
            return None
        if matcher.is_terminated():
            return None  # finishing: nothing left to draft
        accepted = getattr(req.grammar, "accepted_tokens", None)
        if accepted is None or len(accepted) == len(req.output_ids) + len(prev):
            return matcher
        if prev and len(accepted) == len(req.output_ids):  # FSM one step behind: catch up
            fork = matcher.fork()
            if all(not fork.is_terminated() and fork.accept_token(int(t)) for t in prev):
                self.fed_relayed += 1
                return fork
        self.skipped_stale += 1  # the matcher is not at the committed state
        return None

    def candidates(self, slots: int) -> int:
        """Candidate nodes to ask the drafter for a grammar request with ``slots`` nodes."""
        return slots * CANDIDATES_PER_SLOT

    # -- the step -----------------------------------------------------------------------
    def shape_batch(
        self,
        reqs: list[Any],
        trees: list[DraftTree],
        slots: int,
        matchers: list[Any | None],
        prevs: list[list[int]] | None = None,
    ) -> list[DraftTree]:
        """Each grammar request's tree shaped to ``slots`` nodes; the others unchanged.
        ``prevs``: per request, its relayed tokens (overlap), as given to :meth:`matcher_of`."""
        budget = StepBudget(self.budget_s)
        self.steps += 1
        if prevs is None:
            prevs = [[] for _ in reqs]
        try:
            return self._shape_all(reqs, trees, slots, matchers, prevs, budget)
        finally:
            self.shape_s += time.perf_counter() - budget.started

    def _shape_all(
        self,
        reqs: list,
        trees: list[DraftTree],
        slots: int,
        matchers: list,
        prevs: list[list[int]],
        budget: StepBudget,
    ) -> list[DraftTree]:
        out = list(trees)
        for i, (req, matcher, prev) in enumerate(zip(reqs, matchers, prevs, strict=True)):
            if matcher is None:
                continue
            tokenizer = self._tokenizer(req)
            self._learn(req, prev, tokenizer)
            if budget.spent():
                self.stats.over_budget += 1
                out[i] = cap_tree(trees[i], slots)  # unshaped, cut to the slots
                continue
            try:
                cursor = XGrammarCursor(
                    matcher, _stop_ids(req), self._style_of(req, prev), _vocab_size(req)
                )
                out[i] = shape(trees[i], cursor, slots, tokenizer, self.stats)
                self._remember(req, len(req.output_ids) + len(prev), cursor)
            except Exception as exc:  # noqa: BLE001 - today's draft, never a failed step
                self.stats.faults += 1
                if self.stats.faults == 1 or self.stats.faults % 1000 == 0:
                    logger.warning(
                        "SUFFIX: grammar-aware drafting failed (%s: %s); that request keeps "
                        "its plain draft; %d such so far",
                        type(exc).__name__,
                        exc,
                        self.stats.faults,
                    )
                out[i] = cap_tree(trees[i], slots)  # unshaped, cut to the slots
        return out

    def forget(self, rids: list[str]) -> None:
        for rid in rids:
            self._pending.pop(rid, None)
        self.style.forget(rids)

    def _style_of(self, req: Any, prev: list[int]) -> Any | None:
        try:
            return self.style.of(req, prev)
        except Exception:  # noqa: BLE001 - the request's own grammar still shapes its draft
            self.style_faults += 1
            self.style.disable(req.rid)
            return None

    def summary(self) -> dict[str, Any]:
        return {
            **{f"grammar_{k}": v for k, v in self.stats.as_dict().items()},
            "grammar_stale_skips": self.skipped_stale,
            "grammar_fed_relayed": self.fed_relayed,
            "grammar_barrier_steps": self.barrier_steps,
            "grammar_steps": self.steps,
            "grammar_shape_ms_per_step": round(1000 * self.shape_s / self.steps, 3)
            if self.steps
            else 0.0,
            "grammar_style_left": self.style.left_style,
            "grammar_style_faults": self.style_faults,
            "grammar_learned_strings": len(self.tokenizer) if self.tokenizer else 0,
        }

    # -- forced strings as the target tokenises them ------------------------------------------
    def _tokenizer(self, req: Any) -> ForcedTokenizer:
        if self.tokenizer is None:
            vocab = None
            try:
                vocab = list(req.grammar.ctx.tokenizer_info.decoded_vocab)
            except Exception:  # noqa: BLE001 - longest match and learning need it; drafts do not
                logger.info(
                    "SUFFIX: grammar drafts: no decoded vocabulary; forced strings unlearned"
                )
            self.tokenizer = ForcedTokenizer(vocab=vocab, encode=_hf_encoder(self.tokenizer_path))
        return self.tokenizer

    def _remember(self, req: Any, committed: int, cursor: XGrammarCursor) -> None:
        forced = cursor.forced_string()  # at the committed state (the cursor is back there)
        if forced:
            self._pending[req.rid] = (committed, forced)
            while len(self._pending) > PENDING_BOUND:
                self._pending.pop(next(iter(self._pending)))
        else:
            self._pending.pop(req.rid, None)

    def _learn(self, req: Any, prev: list[int], tokenizer: ForcedTokenizer) -> None:
        pending = self._pending.pop(req.rid, None)
        if pending is None:
            return
        start, forced = pending
        committed = committed_tail(req, prev, start)
        if committed:
            tokenizer.learn(forced, committed)


def _stop_ids(req: Any) -> list[int]:
    try:
        ids = req.grammar.matcher.stop_token_ids
        return [int(t) for t in ids]
    except Exception:  # noqa: BLE001
        return []


def _hf_encoder(path: str | None) -> Any:
    """The served model's tokenizer's ``encode`` (no special tokens), or None."""
    if not path:
        return None
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        return lambda s: tok.encode(s, add_special_tokens=False)
    except Exception as exc:  # noqa: BLE001
        logger.info("SUFFIX: grammar drafts tokenise forced strings by vocabulary (%s)", exc)
        return None
