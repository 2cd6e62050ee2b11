"""Grammar-aware drafts (sglang_spec_ext/suffix/grammar.py) against a small string grammar,
and the real xgrammar matcher through the serving adapter's cursor."""

from __future__ import annotations

import json
import os

import pytest

from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.suffix.grammar import (
    FORCED_PROB,
    ForcedTokenizer,
    ShapeStats,
    alternatives,
    forced_chain,
    prune,
    shape,
)

VOCAB = [b"<s>", b'{"', b"name", b'":', b' "', b"a", b"b", b'"}', b"n", b"ame", b"x"]
STOP = 0
TOK = {piece: i for i, piece in enumerate(VOCAB)}


class StringCursor:
    """The language: exactly the strings in ``allowed`` followed by the stop token."""

    def __init__(self, allowed: list[str], text: str = "") -> None:
        self.allowed = [a.encode() for a in allowed]
        self.stack = [text.encode()]
        self.stopped = False
        self.calls = 0

    @property
    def text(self) -> bytes:
        return self.stack[-1]

    def accept(self, token: int) -> bool:
        self.calls += 1
        if self.stopped:
            return False
        if token == STOP:
            if self.text in self.allowed:
                self.stack.append(self.text)
                self.stopped = True
                return True
            return False
        nxt = self.text + VOCAB[token]
        if any(a.startswith(nxt) for a in self.allowed):
            self.stack.append(nxt)
            return True
        return False

    def rollback(self, n: int) -> None:
        for _ in range(n):
            if self.stopped and self.stack[-1] == self.stack[-2]:
                self.stopped = False
            self.stack.pop()
        assert self.stack, "rolled back past the committed state"

    def forced_string(self) -> str:
        rest = [a[len(self.text) :] for a in self.allowed if a.startswith(self.text)]
        if self.stopped or not rest:
            return ""
        prefix = os.path.commonprefix(rest)
        return prefix.decode()

    def forced_stop(self) -> int | None:
        rest = [a for a in self.allowed if a.startswith(self.text) and a != self.text]
        return STOP if self.text in self.allowed and not rest and not self.stopped else None


def tree(tokens, parents, probs) -> DraftTree:
    return DraftTree(list(tokens), list(parents), list(probs), float(sum(probs)), 3)


def test_prune_cuts_a_rejected_branch_and_its_subtree_and_restores_the_cursor() -> None:
    cur = StringCursor(['{"name": "a"}'], text='{"name": "')
    # 0:'a' (ok) -> 1:'"}' (ok); 2:'b' (rejected) -> 3:'"}' (below a rejected node)
    t = tree([TOK[b"a"], TOK[b'"}'], TOK[b"b"], TOK[b'"}']], [-1, 0, -1, 2], [0.6, 0.5, 0.3, 0.2])
    kept, cut = prune(t, cur)
    assert kept == [0, 1] and cut == 2
    assert cur.stack == [b'{"name": "'], "the cursor is back at the committed state"


def test_shape_fills_freed_slots_with_the_next_best_candidates() -> None:
    cur = StringCursor(['{"name": "a"}', '{"name": "b"}'], text='{"name": "')
    # best branch rejected ('x'), then two admitted branches; the forced stop token below
    # 'a' '"}' (0.45 * 0.9) ranks below 'b' (0.42) and misses the budget
    t = tree([TOK[b"x"], TOK[b"a"], TOK[b"b"], TOK[b'"}']], [-1, -1, -1, 1], [0.7, 0.5, 0.42, 0.45])
    out = shape(t, cur, max_nodes=3, tokenizer=ForcedTokenizer(VOCAB))
    assert [VOCAB[x] for x in out.tokens] == [b"a", b"b", b'"}']
    assert out.parents == [-1, -1, 0]
    assert cur.stack == [b'{"name": "']


def test_forced_continuation_drafted_where_the_tree_has_nothing() -> None:
    cur = StringCursor(['{"name": "a"}', '{"name": "b"}'])
    stats = ShapeStats()
    out = shape(DraftTree(), cur, max_nodes=8, tokenizer=ForcedTokenizer(VOCAB), stats=stats)
    # forced: '{"name": "' by longest vocabulary pieces; then 'a' or 'b' is free
    assert b"".join(VOCAB[x] for x in out.tokens) == b'{"name": "'
    assert out.parents == [-1, 0, 1, 2]
    assert out.probs == pytest.approx([FORCED_PROB ** (i + 1) for i in range(4)])
    assert stats.forced == 4 and stats.cut == 0 and cur.stack == [b""]


def test_forced_chain_below_the_most_likely_path_and_the_stop_token() -> None:
    cur = StringCursor(['{"name": "a"}'], text='{"name":')
    t = tree([TOK[b' "'], TOK[b"a"]], [-1, 0], [0.8, 0.7])
    out = shape(t, cur, max_nodes=4, tokenizer=ForcedTokenizer(VOCAB))
    assert [VOCAB[x] for x in out.tokens] == [b' "', b"a", b'"}', b"<s>"]  # '"}' then the stop
    assert out.parents == [-1, 0, 1, 2]
    assert out.probs[2] == pytest.approx(0.7 * FORCED_PROB)


def test_node_budget_keeps_the_most_likely_nodes_closed_under_parents() -> None:
    cur = StringCursor(['{"name": "a"}'])
    out = shape(DraftTree(), cur, max_nodes=2, tokenizer=ForcedTokenizer(VOCAB))
    assert [VOCAB[x] for x in out.tokens] == [b'{"', b"name"]
    chain, _ = forced_chain(StringCursor(['{"name": "a"}']), ForcedTokenizer(VOCAB), budget=0)
    assert chain == []


def test_learned_tokenisation_wins_and_is_bounded() -> None:
    tk = ForcedTokenizer(VOCAB, bound=2)
    assert tk.tokens("name") == [TOK[b"name"]]  # longest match
    # the target spelled it 'n' + 'ame' (then more): learned exactly
    assert tk.learn("name", [TOK[b"n"], TOK[b"ame"], TOK[b'":']])
    assert tk.tokens("name") == [TOK[b"n"], TOK[b"ame"]]
    # a token straddling the forced string's end teaches nothing
    assert not tk.learn('{"na', [TOK[b'{"'], TOK[b"name"]])
    tk.learn("a", [TOK[b"a"]])
    tk.learn("b", [TOK[b"b"]])
    assert len(tk) == 2 and tk.learned("name") is None  # oldest dropped
    cur = StringCursor(['{"name": "a"}', '{"name": "b"}'], text='{"')
    assert cur.forced_string() == 'name": "'
    tk.learn('name": "', [TOK[b"n"], TOK[b"ame"], TOK[b'":'], TOK[b' "'], TOK[b"a"]])
    stats = ShapeStats()
    out = shape(DraftTree(), cur, max_nodes=8, tokenizer=tk, stats=stats)
    assert out.tokens == [TOK[b"n"], TOK[b"ame"], TOK[b'":'], TOK[b' "']]
    assert stats.forced_learned == 4 and stats.forced == 4


def test_an_untokenisable_forced_string_ends_the_chain() -> None:
    # '"a"}' has no vocabulary piece for its first byte: nothing drafted, no endless loop
    cur = StringCursor(['{"name": "a"}'], text='{"name": ')
    chain, _ = forced_chain(cur, ForcedTokenizer(VOCAB), budget=8)
    assert chain == [] and cur.calls == 0


def test_encoder_tokenisation_is_checked_by_the_grammar() -> None:
    # an encoder that tokenises wrongly: the grammar refuses the piece, the chain stops
    tk = ForcedTokenizer(VOCAB, encode=lambda s: [TOK[b"x"]])
    chain, _ = forced_chain(StringCursor(['{"name": "a"}']), tk, budget=8)
    assert chain == []


def test_real_xgrammar_cursor_matches_the_string_grammar_behaviour(tmp_path) -> None:
    """The serving adapter's cursor over a fork of a real xgrammar matcher: the request's
    own matcher never moves, forced strings come from the JSON schema."""
    xg = pytest.importorskip("xgrammar")
    from transformers import AutoTokenizer

    from sglang_spec_ext.models.testing.llama import build_tiny_llama
    from sglang_spec_ext.suffix.xgrammar_cursor import XGrammarCursor

    model = build_tiny_llama(tmp_path / "tiny", seed=0)
    tok = AutoTokenizer.from_pretrained(model)
    info = xg.TokenizerInfo.from_huggingface(tok)
    schema = {"type": "object", "properties": {"unit": {"enum": ["celsius", "kelvin"]}},
              "required": ["unit"]}  # fmt: skip
    compiled = xg.GrammarCompiler(info).compile_json_schema(
        json.dumps(schema), any_whitespace=False
    )
    matcher = xg.GrammarMatcher(compiled)
    cursor = XGrammarCursor(matcher, list(matcher.stop_token_ids))
    tk = ForcedTokenizer(
        list(info.decoded_vocab), encode=lambda s: tok.encode(s, add_special_tokens=False)
    )
    out = shape(DraftTree(), cursor, max_nodes=16, tokenizer=tk)
    text = tok.decode(out.tokens)
    assert text.startswith('{"unit": "'), text
    assert matcher.find_jump_forward_string() == '{"unit": "', "the request's matcher did not move"
    # the enum's two values share no prefix: the forced chain stops there
    assert "celsius" not in text and "kelvin" not in text


def test_compact_style_matcher_forces_separators_the_lenient_grammar_does_not(tmp_path) -> None:
    """Under optional whitespace (the host's default JSON grammar) xgrammar forces almost
    nothing; the compact companion of the same schema forces the separators and property
    names, each token still admitted by the request's own grammar."""
    xg = pytest.importorskip("xgrammar")
    from transformers import AutoTokenizer

    from sglang_spec_ext.models.testing.llama import build_tiny_llama
    from sglang_spec_ext.suffix.xgrammar_cursor import XGrammarCursor

    tok = AutoTokenizer.from_pretrained(build_tiny_llama(tmp_path / "tiny", seed=0))
    info = xg.TokenizerInfo.from_huggingface(tok)
    schema = json.dumps({"type": "object", "properties": {"city": {"type": "string"},
                         "unit": {"enum": ["celsius", "kelvin"]}}, "required": ["city", "unit"]})  # fmt: skip
    compiler = xg.GrammarCompiler(info)
    lenient = xg.GrammarMatcher(compiler.compile_json_schema(schema, any_whitespace=True))
    compact = xg.GrammarMatcher(compiler.compile_json_schema(schema, any_whitespace=False))
    tk = ForcedTokenizer(
        list(info.decoded_vocab), encode=lambda s: tok.encode(s, add_special_tokens=False)
    )
    alone = shape(DraftTree(), XGrammarCursor(lenient, []), 16, tk)
    styled = shape(DraftTree(), XGrammarCursor(lenient, [], compact), 16, tk)
    assert len(styled.tokens) > len(alone.tokens)
    assert tok.decode(styled.tokens).startswith('{"city": "'), tok.decode(styled.tokens)
    assert all(lenient.fork().accept_token(t) for t in styled.tokens[:1])
    # neither the request's matcher nor the companion moved
    assert lenient.fork().find_jump_forward_string() == "{"
    assert compact.find_jump_forward_string() == '{"city": "'
    # a token only the lenient grammar admits (a newline after the brace): the compact
    # companion is silent below it, and speaks again once that token is rolled back
    cursor = XGrammarCursor(lenient, [], compact)
    brace, newline = (
        tok.encode("{", add_special_tokens=False),
        tok.encode("\n", add_special_tokens=False),
    )
    assert len(brace) == 1 and len(newline) == 1
    assert cursor.accept(brace[0]) and cursor.forced_string() == '"city": "'
    assert cursor.accept(newline[0])
    assert cursor.forced_string() == cursor.m.find_jump_forward_string() == ""
    cursor.rollback(1)
    assert cursor.forced_string() == '"city": "'
    cursor.rollback(1)
    assert compact.find_jump_forward_string() == '{"city": "'


def _city_grammar(tmp_path):
    """xgrammar, the tiny model's path, its tokenizer and tokenizer info, and a one-property
    JSON schema with its compiled grammar (as the host compiles it)."""
    xg = pytest.importorskip("xgrammar")
    from transformers import AutoTokenizer

    from sglang_spec_ext.models.testing.llama import build_tiny_llama

    model = build_tiny_llama(tmp_path / "tiny", seed=0)
    tok = AutoTokenizer.from_pretrained(model)
    info = xg.TokenizerInfo.from_huggingface(tok)
    schema = json.dumps({"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]})  # fmt: skip
    return xg, model, tok, info, schema, xg.GrammarCompiler(info).compile_json_schema(schema)


def test_grammar_drafts_on_host_shaped_requests(tmp_path, caplog) -> None:
    """GrammarDrafts (the SUFFIX worker's part) on stand-in requests holding real xgrammar
    grammars: shapes in-sync requests, leaves a stale matcher or another backend's grammar
    alone (said once), keeps unshaped drafts past the time budget, learns a forced string's
    tokenisation from what the request committed next, and forgets a closed request."""
    import logging
    from types import SimpleNamespace

    from sglang_spec_ext.sglang.workers.suffix_grammar import GrammarDrafts

    xg, model, tok, info, schema, compiled = _city_grammar(tmp_path)

    def req(rid, output=()):
        m = xg.GrammarMatcher(compiled)
        for t in output:
            assert m.accept_token(t)
        grammar = SimpleNamespace(matcher=m, accepted_tokens=list(output),
                                  ctx=SimpleNamespace(tokenizer_info=info))  # fmt: skip
        return SimpleNamespace(rid=rid, grammar=grammar, output_ids=list(output),
                               sampling_params=SimpleNamespace(json_schema=schema))  # fmt: skip

    gd = GrammarDrafts(enabled=True, budget_ms=1000.0, tokenizer_path=str(model))
    fresh, stale = req("a"), req("b")
    stale.grammar.accepted_tokens = [1]  # the matcher is not at the committed state
    other = SimpleNamespace(rid="c", grammar=object(), output_ids=[])
    with caplog.at_level(logging.INFO, logger="sglang_spec_ext"):
        matchers = [gd.matcher_of(r) for r in (fresh, stale, other, other)]
    assert matchers[0] is fresh.grammar.matcher and matchers[1:] == [None, None, None]
    assert gd.skipped_stale == 1
    assert sum("xgrammar backend only" in r.message for r in caplog.records) == 1
    out = gd.shape_batch([fresh], [DraftTree()], 8, matchers[:1])
    text = tok.decode(out[0].tokens)
    assert text.startswith('{"city": "'), text  # the one-line layout companion
    assert gd.summary()["grammar_forced"] == len(out[0].tokens)
    # next step: the request committed the forced string its own way; it is learned
    committed = tok.encode('{"city": "', add_special_tokens=False)
    later = req("a", committed)
    gd.shape_batch([later], [DraftTree()], 8, [later.grammar.matcher])
    # the first step's forced string was the one-line layout's (it extends the lenient
    # grammar's "{"); the target's tokens for it are learned
    assert gd.tokenizer.learned('{"city": "') == tuple(committed)
    gd.forget(["a"])
    assert "a" not in gd._pending
    # no time left: the draft stays as drafted, cut to the slots
    gd0 = GrammarDrafts(enabled=True, budget_ms=0.0)
    big = DraftTree(list(range(5, 15)), [-1] + list(range(9)), [0.9] * 10, 9.0, 4)
    cut = gd0.shape_batch([fresh], [big], 4, [fresh.grammar.matcher])[0]
    assert cut.tokens == big.tokens[:4] and gd0.stats.over_budget == 1


def test_grammar_drafts_under_overlap_relay(tmp_path) -> None:
    """Under overlap scheduling a request's committed tokens are ``output_ids`` plus the
    previous step's relayed tokens. GrammarDrafts takes its matcher as is where the FSM has
    accepted them (SUFFIX calls the host's grammar barrier first), feeds a fork of it where
    the FSM is one step behind (HYBRID: the host's verify advances it later), never moving
    the request's own matcher, and skips any other count; the layout companion and the
    learned tokenisation follow the same committed tokens."""
    from types import SimpleNamespace

    from sglang_spec_ext.sglang.workers.suffix_grammar import GrammarDrafts
    from sglang_spec_ext.suffix.xgrammar_cursor import committed_tail

    xg, model, tok, info, schema, compiled = _city_grammar(tmp_path)
    head = [*tok.encode("{", add_special_tokens=False), *tok.encode('"', add_special_tokens=False)]
    assert len(head) == 2

    def req(output, fed):
        m = xg.GrammarMatcher(compiled)
        for t in fed:
            assert m.accept_token(t)
        grammar = SimpleNamespace(matcher=m, accepted_tokens=list(fed),
                                  ctx=SimpleNamespace(tokenizer_info=info))  # fmt: skip
        return SimpleNamespace(rid="a", grammar=grammar, output_ids=list(output),
                               sampling_params=SimpleNamespace(json_schema=schema))  # fmt: skip

    out, prev = head[:1], head[1:]
    assert committed_tail(req(out, out), prev, 0) == head
    assert committed_tail(req(out, out), prev, len(head) - 1) == head[-1:]
    gd = GrammarDrafts(enabled=True, budget_ms=1000.0, tokenizer_path=str(model))
    advanced = req(out, head)  # the barrier ran: the FSM holds the relayed tokens
    assert gd.matcher_of(advanced, prev) is advanced.grammar.matcher
    behind = req(out, out)  # not yet: a fork is fed them; the request's matcher stays
    fork = gd.matcher_of(behind, prev)
    assert fork is not None and fork is not behind.grammar.matcher
    assert gd.fed_relayed == 1
    assert fork.find_jump_forward_string().startswith("city")
    assert behind.grammar.matcher.fork().accept_token(head[1])  # it still stands before them
    assert gd.matcher_of(req(out, []), prev) is None and gd.skipped_stale == 1
    bad = req(out, out)
    assert gd.matcher_of(bad, [tok.encode("}", add_special_tokens=False)[0]] * 3) is None
    # shaping from the relayed state: the draft continues the committed text
    shaped = gd.shape_batch([behind], [DraftTree()], 8, [fork], [prev])[0]
    assert tok.decode(shaped.tokens).startswith('city": "'), tok.decode(shaped.tokens)
    assert gd._pending["a"][0] == len(head)  # remembered at the committed count


class BranchingCursor(StringCursor):
    """StringCursor that also lists the tokens it admits (``next_tokens``)."""

    def next_tokens(self, limit: int) -> list[int] | None:
        ok = []
        for tok in range(1, len(VOCAB)):
            if self.accept(tok):
                self.rollback(1)
                ok.append(tok)
        return ok if len(ok) <= limit else None


def test_alternatives_drafted_as_branches_where_the_grammar_admits_few() -> None:
    """Where nothing is forced but the grammar admits a few continuations, each is a branch
    (its spelling, then what the grammar forces after it), sharing the path probability."""
    cur = BranchingCursor(['{"name": "a"}', '{"name": "b"}'], text='{"name": "')
    stats = ShapeStats()
    out = shape(DraftTree(), cur, max_nodes=8, tokenizer=ForcedTokenizer(VOCAB), stats=stats)
    spelled = sorted(
        b"".join(VOCAB[out.tokens[j]] for j in _path(out, i))
        for i in range(len(out.tokens))
        if i not in out.parents
    )
    assert spelled == [b'a"}<s>', b'b"}<s>']  # each alternative, its forced rest, the stop
    first = [i for i, p in enumerate(out.parents) if p == -1]
    assert [out.probs[i] for i in first] == pytest.approx([FORCED_PROB / 2] * 2)
    assert stats.branched == 1 and stats.alt_nodes == 6 and stats.forced == 0
    assert cur.stack == [b'{"name": "']
    # more continuations than asked for (b, x, ame, name: "a" alone is extended by "ame"),
    # or more tokens: no branches
    many = BranchingCursor([f'{{"name": "{c}"}}' for c in ("a", "b", "x", "ame", "name")],
                           text='{"name": "')  # fmt: skip
    assert len(alternatives(many, ForcedTokenizer(VOCAB), 8, max_alts=4)) == 4
    assert alternatives(many, ForcedTokenizer(VOCAB), 8, max_alts=3) == []
    assert alternatives(cur, ForcedTokenizer(VOCAB), 8, max_tokens=1) == []
    assert alternatives(cur, ForcedTokenizer(None), 8) == []  # no vocabulary to spell with


def _path(t: DraftTree, i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = t.parents[i]
    return out[::-1]


def test_enum_alternatives_with_xgrammar(tmp_path) -> None:
    """The real cursor: after ``{"unit": `` the layout forces the quote, then the enum's
    values are drafted as branches; a spelling others extend is none of its own."""
    xg = pytest.importorskip("xgrammar")
    from transformers import AutoTokenizer

    from sglang_spec_ext.models.testing.llama import build_tiny_llama
    from sglang_spec_ext.suffix.xgrammar_cursor import XGrammarCursor

    tok = AutoTokenizer.from_pretrained(build_tiny_llama(tmp_path / "tiny", seed=0))
    info = xg.TokenizerInfo.from_huggingface(tok)
    schema = json.dumps({"type": "object", "properties": {"unit": {"enum": ["celsius", "kelvin"]}},
                         "required": ["unit"]})  # fmt: skip
    compiler = xg.GrammarCompiler(info)
    lenient = xg.GrammarMatcher(compiler.compile_json_schema(schema, any_whitespace=True))
    compact = xg.GrammarMatcher(compiler.compile_json_schema(schema, any_whitespace=False))
    for t in tok.encode('{"unit": ', add_special_tokens=False):
        assert lenient.accept_token(t) and compact.accept_token(t)
    tk = ForcedTokenizer(
        list(info.decoded_vocab), encode=lambda s: tok.encode(s, add_special_tokens=False)
    )
    stats = ShapeStats()
    cursor = XGrammarCursor(lenient, [], compact, info.vocab_size)
    out = shape(DraftTree(), cursor, 16, tk, stats)
    leaves = [i for i in range(len(out.tokens)) if i not in out.parents]
    texts = sorted(tok.decode([out.tokens[j] for j in _path(out, i)]) for i in leaves)
    assert len(texts) == 2 and texts[0].startswith('"celsius"}'), texts
    assert texts[1].startswith('"kelvin"}'), texts
    assert stats.branched == 1 and stats.forced >= 1
    assert lenient.fork().find_jump_forward_string() == ""  # the request's matcher unmoved
    assert XGrammarCursor(lenient, [], None, None).next_tokens(8) is None  # no vocab size


def test_grammar_nodes_are_calibrated_apart_from_suffix_nodes() -> None:
    """The ragged gate's node calibration learns forced and alternative nodes in cells of
    their own (``DraftTree.origins``): what they teach moves neither the suffix nodes' cells
    nor theirs the other way; a cut tree keeps its nodes' origins."""
    import numpy as np

    from sglang_spec_ext.sglang.serving.request_options import cap_tree
    from sglang_spec_ext.suffix.draft import ALTERNATIVE_NODE, FORCED_NODE, SUFFIX_NODE
    from sglang_spec_ext.suffix.lengths import _subtree
    from sglang_spec_ext.suffix.node_calibration import NodeCalibration

    cur = BranchingCursor(['{"name": "a"}', '{"name": "b"}'], text='{"name":')
    t = tree([TOK[b"x"], TOK[b' "']], [-1, -1], [0.5, 0.45])
    out = shape(t, cur, max_nodes=6, tokenizer=ForcedTokenizer(VOCAB))
    assert out.origins[0] == SUFFIX_NODE and FORCED_NODE not in out.origins[:1]
    assert ALTERNATIVE_NODE in out.origins  # 'a' and 'b' below ' "'
    assert cap_tree(out, 2).origins == out.origins[:2]
    assert _subtree(out, np.array([True] * 2 + [False] * (len(out) - 2))).origins == out.origins[:2]

    cal = NodeCalibration()
    forced = DraftTree([5, 6], [-1, 0], [0.9, 0.81], 1.71, 2, [FORCED_NODE, FORCED_NODE])
    suffixed = DraftTree([5, 6], [-1, 0], [0.9, 0.81], 1.71, 2)
    before_suffix = cal.calibrate(suffixed).copy()
    for _ in range(50):  # forced nodes never accepted
        cal.observe(forced, [7, 7])
    assert cal.calibrate(forced)[0] < 0.1
    assert cal.calibrate(suffixed) == pytest.approx(before_suffix)  # untouched
    for _ in range(50):  # suffix nodes always accepted
        cal.observe(suffixed, [5, 6])
    assert cal.calibrate(forced)[0] < 0.1 and cal.calibrate(suffixed)[0] > 0.9
    assert cal.stats()["lengths_grammar_nodes_seen"] == [50, 0]


def test_forced_strings_are_tokenised_without_their_unstable_tail() -> None:
    """A forced string's last token may merge with what follows ('": ' then a value: the
    target writes '": ' + ' a' as '":' ' a'); only the tokens no continuation changes are
    drafted, and the encoding is cached."""
    pieces = ['":', '"', ":", " a", " 0", ' "', " ", "a", "0", "\n"]

    calls = []

    def encode(s: str) -> list[int]:
        calls.append(s)
        out, i = [], 0
        while i < len(s):
            best = max((p for p in pieces if s.startswith(p, i)), key=len)
            out.append(pieces.index(best))
            i += len(best)
        return out

    tk = ForcedTokenizer(vocab=[p.encode() for p in pieces], encode=encode)
    assert tk.tokens('": ') == [pieces.index('":')]
    assert tk.tokens('":') == [pieces.index('":')]  # nothing re-merges with a colon here
    n = len(calls)
    assert tk.tokens('": ') == [pieces.index('":')] and len(calls) == n  # cached


def test_the_served_tokenizer_path_falls_back_to_the_model_path() -> None:
    from types import SimpleNamespace

    from sglang_spec_ext.sglang.workers.suffix_grammar import served_tokenizer_path

    assert served_tokenizer_path(SimpleNamespace(tokenizer_path="/t", model_path="/m")) == "/t"
    assert served_tokenizer_path(SimpleNamespace(tokenizer_path=None, model_path="/m")) == "/m"
    assert served_tokenizer_path(None) is None
