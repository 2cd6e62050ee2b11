"""Scopes (tenants) and corpora of the suffix drafter, and the scope of a request."""

from __future__ import annotations

import random

import pytest

from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter, native_available
from sglang_spec_ext.suffix.memory import estimate_bytes
from sglang_spec_ext.suffix.scopes import parse_corpus_id, scope_key

BACKENDS = ["python"] + (["native"] if native_available() else [])
ANSWER = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
PROMPT = [1, 2, 3]


def test_scope_key_rules():
    assert scope_key(None) == scope_key("") == ""
    a, b = scope_key("tenant-a"), scope_key("tenant-b")
    assert a and b and a != b and a == scope_key("tenant-a")
    assert "tenant" not in a  # a digest: the salt is not kept
    # Extra key and adapter separate requests of one tenant; the host folds the adapter
    # into the extra key, another host may not: the same scope either way.
    assert scope_key("t", "k1") != scope_key("t", "k2") != scope_key("t")
    assert scope_key(None, "lora-1") == scope_key(None, None, "lora-1") != scope_key(None, "lora-2")
    assert scope_key(None, "xlora-1", "lora-1") == scope_key(None, "xlora-1")
    assert scope_key("t", isolation="strict") is None
    assert scope_key(None, "lora-1", isolation="strict") == scope_key(None, "lora-1")
    assert scope_key("t", "k", "l", isolation="shared") == ""
    with pytest.raises(ValueError, match="isolation"):
        scope_key("t", isolation="open")


def test_parse_corpus_id():
    assert parse_corpus_id("docs") == ("docs", [])
    name, scopes = parse_corpus_id("docs@a, b")
    assert name == "docs" and scopes == [scope_key("a"), scope_key("b")]
    for bad in ("", "  ", "@a", "docs@", "docs@ , "):
        with pytest.raises(ValueError):
            parse_corpus_id(bad)


def _answer(draft):
    """Whether a draft proposes the start of ANSWER (a chain, as deep as the tree allows)."""
    return len(draft) >= 4 and draft == ANSWER[: len(draft)]


def _serve(d, rid, scope, prompt=PROMPT, answer=ANSWER):
    """A request that drafts after its prompt, then commits ``answer``; the draft it got."""
    d.start_request(rid, prompt, scope=scope)
    draft = d.speculate(rid, 8)
    d.extend_request(rid, answer)
    d.finish_request(rid)
    return draft.tokens


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_scope_drafts_only_from_its_own_requests(backend):
    d = SuffixDrafter(SuffixConfig(max_depth=8), backend)
    assert _serve(d, "a1", scope_key("a")) == []
    assert _serve(d, "b1", scope_key("b")) == []  # nothing of tenant a's
    assert _serve(d, "u1", "") == []  # nor the unsalted scope
    assert _serve(d, "x1", None) == []  # strict: no global tree
    assert _answer(_serve(d, "a2", scope_key("a")))
    assert _answer(_serve(d, "b2", scope_key("b")))  # b's own first request
    shared = SuffixDrafter(SuffixConfig(max_depth=8), backend)
    _serve(shared, "a1", "")
    assert _answer(_serve(shared, "b1", ""))  # one tree: the leak scopes close


@pytest.mark.parametrize("backend", BACKENDS)
def test_bounds_per_scope_and_in_total(backend):
    cfg = SuffixConfig(max_depth=4, max_cached_tokens=60, max_scope_tokens=40, global_prompt_cap=0)
    d = SuffixDrafter(cfg, backend)
    n = iter(range(100, 10_000, 13))

    def serve(rid, scope):
        first = next(n)
        _serve(d, rid, scope, [], list(range(first, first + 13)))  # 13 tokens each

    def held():
        return [(scope, tokens[0]) for scope, tokens in d.export_cached()]

    for i in range(4):  # a: 52 tokens > 40: a's own oldest goes
        serve(f"a{i}", "a")
    assert held() == [("a", 113), ("a", 126), ("a", 139)]
    serve("b0", "b")  # 52 in total
    serve("b1", "b")  # 65 > 60: the oldest of any scope goes
    assert held() == [("a", 126), ("a", 139), ("b", 152), ("b", 165)]
    serve("b2", "b")
    serve("b3", "b")  # b: 52 > 40: b's own oldest goes; a keeps what b cannot take
    assert held() == [("a", 139), ("b", 165), ("b", 178), ("b", 191)]
    assert d.stats()["cached_tokens"] == 52 and d.stats()["scopes"] == 3
    serve("c0", "c")
    serve("c1", "c")  # 78 > 60: a's last and b's oldest go; scope a goes with them
    assert held() == [("b", 178), ("b", 191), ("c", 204), ("c", 217)]
    assert d.stats()["scopes"] == 3  # "", b, c


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_tenants_stay_bounded(backend):
    cfg = SuffixConfig(max_depth=8, max_cached_requests=50, max_cached_tokens=2000)
    d = SuffixDrafter(cfg, backend)
    rng = random.Random(0)
    for i in range(600):
        answer = [rng.randrange(500) for _ in range(rng.randrange(1, 40))]
        _serve(d, f"r{i}", scope_key(f"tenant-{i % 300}"), [1, 2], answer)
    s = d.stats()
    assert s["cached_requests"] <= 50 and s["cached_tokens"] <= 2000
    assert s["scopes"] <= 51  # every scope holds a cached request ("" aside)
    if backend == "native":
        bound = estimate_bytes(cfg, 0, scoped=True)
        assert s["memory_bytes"] <= bound.total, (s["memory_bytes"], bound)


@pytest.mark.skipif(not native_available(), reason="native backend not built")
def test_a_shrunken_scope_tree_gives_its_memory_back():
    cfg = SuffixConfig(max_depth=16, max_cached_tokens=20_000, global_prompt_cap=0)
    d = SuffixDrafter(cfg, "native")
    rng = random.Random(1)
    for i in range(40):
        _serve(d, f"a{i}", "a", [], [rng.randrange(30000) for _ in range(500)])
    big = d.stats()["memory_bytes"]
    for i in range(39):  # tenant b pushes a's sequences out of the total bound
        _serve(d, f"b{i}", "b", [], [rng.randrange(30000) for _ in range(500)])
    scopes = [s for s, _ in d.export_cached()]
    assert scopes.count("a") == 1
    # Two trees of about the bound's size would be ~2x; the shrunken one was rebuilt.
    assert d.stats()["memory_bytes"] < 1.4 * big


def test_memory_estimate_counts_scopes_and_corpora():
    cfg = SuffixConfig(max_cached_tokens=100_000, max_request_tokens=1000)
    one = estimate_bytes(cfg, 4)
    scoped = estimate_bytes(cfg, 4, scoped=True)
    assert scoped.global_tree > 2 * one.global_tree
    with_corpora = estimate_bytes(cfg, 4, corpus_tokens=50_000)
    assert with_corpora.total > one.total and with_corpora.corpora > 0
    assert "corpora" in with_corpora.describe()


@pytest.mark.parametrize("backend", BACKENDS)
def test_corpora_for_every_scope_or_listed_ones(backend):
    d = SuffixDrafter(SuffixConfig(max_depth=8), backend)
    corpus = d.build_corpus([PROMPT + ANSWER, [5, 5, 5]])
    assert corpus.tokens == 16
    d.attach_corpus("docs", corpus)
    d.attach_corpus("vip", d.build_corpus([[1, 2, 3, 40, 41, 42, 43]]), [scope_key("vip")])
    assert d.corpora() == {"docs": 16, "vip": 7}
    assert _answer(_serve(d, "t1", scope_key("t")))
    assert _answer(_serve(d, "x1", None))  # strict requests read corpora for all
    assert d.remove_corpus("docs") and not d.remove_corpus("docs")
    assert _serve(d, "v1", scope_key("vip"))[:4] == [40, 41, 42, 43]  # the listed salt
    assert _serve(d, "t2", scope_key("t2")) == []  # not another one
    d.reset()  # serving state goes, the operator's corpora stay
    assert d.corpora() == {"vip": 7}
    with pytest.raises(ValueError, match="name"):
        d.attach_corpus("", corpus)


@pytest.mark.parametrize("backend", BACKENDS)
def test_export_import_round_trip(backend):
    d = SuffixDrafter(SuffixConfig(max_depth=8), backend)
    _serve(d, "a1", "a")
    _serve(d, "u1", "")
    saved = d.export_cached()
    assert saved == [("a", [*PROMPT, *ANSWER]), ("", [*PROMPT, *ANSWER])]
    fresh = SuffixDrafter(SuffixConfig(max_depth=8), backend)
    for scope, tokens in saved:
        fresh.import_cached(scope, tokens)
    assert fresh.export_cached() == saved
    assert _answer(_serve(fresh, "a2", "a"))
    assert _serve(fresh, "b1", "b") == []
