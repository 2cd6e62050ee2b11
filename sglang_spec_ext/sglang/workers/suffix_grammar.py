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
indented by 2 or 4), follow the committed tokens (``suffix/xgrammar_cursor.py``) until the output has
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

from sglang_spec_ext.sglang.serving.request_options import cap_tree
from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.suffix.forced_tokens import ForcedTokenizer, PendingForced
from sglang_spec_ext.suffix.grammar import (
    CANDIDATES_PER_SLOT,
    ShapeStats,
    StepBudget,
    shape,
)
from sglang_spec_ext.suffix.xgrammar_cursor import StyleMatchers, XGrammarCursor, committed_tail

logger = logging.getLogger("sglang_spec_ext")


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
        self._pending = PendingForced()  # forced strings to learn the target's tokens of
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
            self._pending.forget(rid)
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
        # at the committed state (the cursor is back there)
        self._pending.remember(req.rid, committed, cursor.forced_string())

    def _learn(self, req: Any, prev: list[int], tokenizer: ForcedTokenizer) -> None:
        self._pending.learn(req.rid, tokenizer, lambda start: committed_tail(req, prev, start))


def _stop_ids(req: Any) -> list[int]:
    try:
        ids = req.grammar.matcher.stop_token_ids
        return [int(t) for t in ids]
    except Exception:  # noqa: BLE001
        return []


def served_tokenizer_path(server_args: Any) -> str | None:
    """Where the served model's tokenizer is: ``--tokenizer-path``, else the model path (the
    scheduler's ``ServerArgs`` in 0.5.23 holds ``tokenizer_path=None`` when the flag was not
    given, seen serving SmolLM2: grammar drafts then fell back to longest-match spelling)."""
    for name in ("tokenizer_path", "model_path"):
        path = getattr(server_args, name, None)
        if isinstance(path, str) and path:
            return path
    return None


def _hf_encoder(path: str | None) -> Any:
    """The served model's tokenizer's ``encode`` (no special tokens), or None."""
    if not path:
        return None
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        return lambda s: tok.encode(s, add_special_tokens=False)
    except Exception as exc:  # noqa: BLE001
        logger.warning(
            "SUFFIX: grammar drafts could not load the tokenizer at %s (%s); forced strings "
            "are tokenised by longest vocabulary match, which the target often spells otherwise",
            path,
            exc,
        )
        return None
