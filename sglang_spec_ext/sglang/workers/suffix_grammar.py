"""Grammar-aware SUFFIX drafts on the host (``suffix/grammar.py`` does the tree work).

For a request with a structured-output grammar (``json_schema``, ``regex``, ``ebnf``,
structural tags: ``req.grammar``), the drafter is asked for more candidate nodes than the
verify width holds; the tree is walked with a *fork* of the request's xgrammar matcher
(never the request's own), branches the grammar rejects are cut, the grammar's forced
continuation is drafted below the most likely path, and the most likely ``width - 1``
nodes are kept. The host's verify then applies the grammar as always, so what the target
commits does not change.

When it runs: the host makes every grammar batch synchronous (``grammar_needs_sync``), so at
draft time a request's matcher has accepted exactly its committed tokens; a request whose
matcher disagrees (its accepted-token count is not the committed count) is left alone.
Which grammars: the host's xgrammar backend (its default). Another backend's grammar
objects (outlines, llguidance) keep today's drafts, said once in the log.

Forced strings are tokenised as the target committed them before: each step the forced
string at every grammar request's committed state is remembered with that position, and
at the next step the committed tokens that spell it exactly are learned
(``ForcedTokenizer``, bounded). Bounded per step by ``SGLANG_SPEC_EXT_GRAMMAR_DRAFT_MS``;
past it the remaining requests keep their unshaped drafts.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.suffix.grammar import ForcedTokenizer, ShapeStats, StepBudget, shape

logger = logging.getLogger("sglang_spec_ext")

#: Requests whose last forced string is remembered for learning (oldest dropped first).
PENDING_BOUND = 4096
#: Candidate nodes asked of the drafter per verify slot for a grammar request.
CANDIDATES_PER_SLOT = 2


class XGrammarCursor:
    """``suffix.grammar.GrammarCursor`` over a fork of the request's xgrammar matcher."""

    def __init__(self, matcher: Any, stop_ids: list[int]) -> None:
        self.m = matcher.fork()
        self.stop_ids = stop_ids

    def accept(self, token: int) -> bool:
        return bool(self.m.accept_token(int(token)))

    def rollback(self, n: int) -> None:
        self.m.rollback(int(n))

    def forced_string(self) -> str:
        if self.m.is_terminated():  # past the stop token xgrammar refuses the question
            return ""
        return self.m.find_jump_forward_string()

    def forced_stop(self) -> int | None:
        # complete and nothing may follow: only a stop token (a one-token check each)
        if not self.m.is_completed() or self.m.is_terminated():
            return None
        for stop in self.stop_ids:
            if self.m.accept_token(stop):
                self.m.rollback(1)
                return stop
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

    # -- which requests -----------------------------------------------------------------
    def matcher_of(self, req: Any) -> Any | None:
        """The request's xgrammar matcher when shaping applies to it, else None."""
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
        accepted = getattr(req.grammar, "accepted_tokens", None)
        if accepted is not None and len(accepted) != len(req.output_ids):
            self.skipped_stale += 1  # the matcher is not at the committed state
            return None
        return matcher

    def candidates(self, slots: int) -> int:
        """Candidate nodes to ask the drafter for a grammar request with ``slots`` nodes."""
        return slots * CANDIDATES_PER_SLOT

    # -- the step -----------------------------------------------------------------------
    def shape_batch(
        self, reqs: list[Any], trees: list[DraftTree], slots: int, matchers: list[Any | None]
    ) -> list[DraftTree]:
        """Each grammar request's tree shaped to ``slots`` nodes; the others unchanged."""
        budget = StepBudget(self.budget_s)
        out = list(trees)
        for i, (req, matcher) in enumerate(zip(reqs, matchers, strict=True)):
            if matcher is None:
                continue
            tokenizer = self._tokenizer(req)
            self._learn(req, tokenizer)
            if budget.spent():
                self.stats.over_budget += 1
                out[i] = _cut(trees[i], slots)
                continue
            try:
                cursor = XGrammarCursor(matcher, _stop_ids(req))
                out[i] = shape(trees[i], cursor, slots, tokenizer, self.stats)
                self._remember(req, cursor)
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
                out[i] = _cut(trees[i], slots)
        return out

    def forget(self, rids: list[str]) -> None:
        for rid in rids:
            self._pending.pop(rid, None)

    def summary(self) -> dict[str, Any]:
        return {
            **{f"grammar_{k}": v for k, v in self.stats.as_dict().items()},
            "grammar_stale_skips": self.skipped_stale,
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

    def _remember(self, req: Any, cursor: XGrammarCursor) -> None:
        forced = cursor.forced_string()  # at the committed state (the cursor is back there)
        if forced:
            self._pending[req.rid] = (len(req.output_ids), forced)
            while len(self._pending) > PENDING_BOUND:
                self._pending.pop(next(iter(self._pending)))
        else:
            self._pending.pop(req.rid, None)

    def _learn(self, req: Any, tokenizer: ForcedTokenizer) -> None:
        pending = self._pending.pop(req.rid, None)
        if pending is None:
            return
        start, forced = pending
        committed = list(req.output_ids[start:])
        if committed:
            tokenizer.learn(forced, committed)


def _cut(tree: DraftTree, slots: int) -> DraftTree:
    """An unshaped candidate tree cut to its first ``slots`` nodes (topological order keeps
    every parent)."""
    if len(tree.tokens) <= slots:
        return tree
    probs = tree.probs[:slots]
    return DraftTree(tree.tokens[:slots], tree.parents[:slots], probs, float(sum(probs)),
                     tree.match_len)  # fmt: skip


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
