"""Suffix drafter behaviour on hand-checked cases, for every available backend."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_spec_ext.suffix import DraftTree, SuffixConfig, SuffixDrafter, native_available
from sglang_spec_ext.suffix.config import PREVIOUS_SUFFIX_SETTINGS

BACKENDS = ["python"] + (["native"] if native_available() else [])


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


def make(backend: str, **kw) -> SuffixDrafter:
    # The hand-checked cases spell out budgets of 1 x match length and whole prompts in
    # the global tree (the settings before issue 14); the current defaults' budget and
    # prompt cap are tested on their own below.
    base = {**PREVIOUS_SUFFIX_SETTINGS, "global_prompt_cap": 65536}
    return SuffixDrafter(SuffixConfig(**{**base, **kw}), backend=backend)


def test_default_budget_grows_with_the_match(backend):
    d = SuffixDrafter(SuffixConfig(), backend=backend)
    d.start_request("a", [1, 2, 3, 4, 5, 6, 7, 1, 2])
    # a 2-token match: the default budget (tuned: 8 x 2 + 4) reaches past the width
    assert d.speculate("a", 5).tokens == [3, 4, 5, 6, 7]
    assert d.speculate("a", 3).tokens == [3, 4, 5]
    # a 1-token match: at most 8 x 1 + 4 = 12 nodes, whatever the width
    d.start_request("b", [99, *range(1, 21), 99])
    assert d.speculate("b", 30).tokens == list(range(1, 13))


def test_default_prompt_cap_links_a_repeated_prompt_to_its_answer(backend):
    """Only a prompt's last 64 tokens enter the global tree (tuned): enough for a
    repeated question to draft its earlier answer from the first step on."""
    d = SuffixDrafter(SuffixConfig(), backend=backend)
    prompt = list(range(1000, 1200))
    d.start_request("a", prompt)
    d.extend_request("a", [7, 8, 9, 10])
    d.finish_request("a")
    assert d.stats()["cached_tokens"] == 64 + 4
    d.start_request("b", prompt)
    assert d.speculate("b", 8).tokens[:4] == [7, 8, 9, 10]


def as_tuple(d: DraftTree):
    return d.tokens, d.parents, d.probs, d.score, d.match_len


def test_chain_from_own_prompt(backend):
    d = make(backend)
    d.start_request("a", [1, 2, 3, 4, 5, 1, 2, 3])
    # [1, 2, 3] was seen once before, followed by 4 5 1 ...; budget = 1.0 * 3
    assert as_tuple(d.speculate("a", 8)) == ([4, 5, 1], [-1, 0, 1], [1.0, 1.0, 1.0], 3.0, 3)


def test_branching_tree_and_tie_order(backend):
    d = make(backend, max_spec_offset=2.0)
    d.start_request("a", [7, 1, 2, 7, 1, 3, 7, 1])
    t = d.speculate("a", 8)
    # [7, 1] continues with 2 or 3 (one each): both children of the root, then
    # each branch's next token; equal probabilities keep push order.
    assert t.tokens == [2, 3, 7, 7]
    assert t.parents == [-1, -1, 0, 1]
    assert t.probs == [0.5, 0.5, 0.5, 0.5]
    assert t.score == 2.0 and t.match_len == 2


def test_chain_mode_takes_the_best_continuation(backend):
    d = make(backend, use_tree=False, max_spec_offset=2.0)
    d.start_request("a", [7, 1, 3, 7, 1, 2, 7, 1])
    t = d.speculate("a", 8)
    assert t.tokens == [2, 7, 1]  # tie 2 vs 3 -> smaller token id; then the data ends
    assert t.parents == [-1, 0, 1]
    assert t.probs == [0.5, 0.5, 0.5]


def test_min_token_prob_cuts_unlikely_continuations(backend):
    d = make(backend, min_token_prob=0.6)
    d.start_request("a", [7, 1, 2, 7, 1, 3, 7, 1])
    t = d.speculate("a", 8)
    assert t.tokens == [] and t.score == 0.0 and t.match_len == 0


def test_budget_grows_with_match_length(backend):
    d = make(backend, max_spec_factor=0.5)
    d.start_request("a", list(range(10)) + list(range(6)))
    t = d.speculate("a", 16)
    assert t.match_len == 6 and t.tokens == [6, 7, 8]  # floor(0.5 * 6)
    assert len(d.speculate("a", 2).tokens) == 2  # max_nodes caps the budget
    assert d.speculate("a", 0).tokens == []


def test_global_tree_shares_finished_outputs(backend):
    d = make(backend)
    d.start_request("a", [50, 51])
    d.extend_request("a", [1, 2, 3, 4, 5, 6])
    d.finish_request("a")
    d.start_request("b", [9, 9, 1, 2, 3])
    assert as_tuple(d.speculate("b", 8)) == ([4, 5, 6], [-1, 0, 1], [1.0, 1.0, 1.0], 3.0, 3)
    assert d.stats()["cached_requests"] == 2


def test_in_flight_requests_share_too(backend):
    d = make(backend)
    d.start_request("a", [])
    d.extend_request("a", [1, 2, 3, 4, 5])
    d.start_request("b", [8, 1, 2])
    assert d.speculate("b", 8).tokens == [3, 4]


def test_prompts_stay_out_of_the_global_tree_when_asked(backend):
    d = make(backend, cache_prompts=False)
    d.start_request("a", [1, 2, 3, 4, 5, 6])
    d.finish_request("a")
    d.start_request("b", [1, 2, 3])
    assert d.speculate("b", 8).tokens == []
    assert d.stats()["cached_tokens"] == 0


def test_global_tree_disabled(backend):
    d = make(backend, max_cached_requests=0)
    d.start_request("a", [1, 2, 3, 4])
    d.finish_request("a")
    d.start_request("b", [1, 2, 3])
    assert d.speculate("b", 8).tokens == []
    assert d.stats()["cached_requests"] == 0


def test_abort_leaves_nothing_behind(backend):
    d = make(backend)
    d.start_request("a", [1, 2, 3, 4, 5, 6, 7])
    d.extend_request("a", [8, 9])
    d.abort_request("a")
    s = d.stats()
    assert (s["active_requests"], s["cached_requests"], s["cached_tokens"]) == (0, 0, 0)
    assert s["global_nodes"] == 0 and s["local_nodes"] == 0 and s["pinned_tokens"] == 0
    d.start_request("b", [1, 2, 3])
    assert d.speculate("b", 8).tokens == []
    with pytest.raises(KeyError):
        d.extend_request("a", [1])


def test_finish_keeps_tokens_but_frees_the_request_tree(backend):
    d = make(backend)
    d.start_request("a", [1, 2, 3, 1, 2])
    d.finish_request("a")
    s = d.stats()
    assert s["active_requests"] == 0 and s["local_nodes"] == 0 and s["cached_tokens"] == 5


def test_eviction_by_request_count_drops_the_oldest(backend):
    d = make(backend, max_cached_requests=3)
    for i in range(4):
        d.start_request(f"r{i}", [])
        d.extend_request(f"r{i}", [100 + i, 1, 2, 3, 10 + i])
        d.finish_request(f"r{i}")
        assert d.stats()["cached_requests"] <= 3
    d.start_request("p", [101, 1, 2, 3])  # evicts r1 (r0 went earlier): r2, r3, p
    t = d.speculate("p", 3)
    assert sorted(t.tokens) == [12, 13] and t.probs == [0.5, 0.5]
    d.finish_request("p")
    d.start_request("q", [103, 1, 2, 3])  # evicts r2: r3, p, q
    assert d.speculate("q", 3).tokens == [13]
    assert d.stats()["cached_requests"] == 3


def test_eviction_by_tokens_keeps_the_bound(backend):
    d = make(backend, max_cached_tokens=50)
    rng = np.random.default_rng(0)
    for i in range(12):
        d.start_request(i, rng.integers(0, 20, size=int(rng.integers(0, 30))).tolist())
        for _ in range(5):
            d.extend_request(i, rng.integers(0, 20, size=3).tolist())
            assert d.stats()["cached_tokens"] <= 50
        if i % 3:
            d.finish_request(i)
    assert 0 < d.stats()["cached_requests"] < 12


def test_in_flight_request_evicted_from_global_keeps_drafting(backend):
    d = make(backend, max_cached_tokens=10)
    d.start_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    d.extend_request("a", [1, 2, 3, 4, 5, 6, 7, 8])  # 17 tokens > 10: evicted
    assert d.stats()["cached_requests"] == 0
    assert d.speculate("a", 3).tokens == [9, 1, 2]  # its own tree still drafts
    d.extend_request("a", [9])
    assert d.stats()["cached_tokens"] == 0


def test_batch_equals_single_calls(backend):
    d = make(backend)
    for i in range(3):
        d.start_request(i, [1, 2, 3, i, 1, 2, 3, i, 1, 2])
    batch = d.speculate_batch([0, 1, 2], 6)
    assert [as_tuple(t) for t in batch] == [as_tuple(d.speculate(i, 6)) for i in range(3)]


def test_numpy_and_tuple_inputs(backend):
    d = make(backend)
    d.start_request("a", np.array([1, 2, 3, 1, 2], dtype=np.int64))
    d.extend_request("a", (3,))
    d.extend_request("a", np.array([1], dtype=np.int32))
    assert d.speculate("a", 4).tokens[:1] == [2]


def test_reset_forgets_everything(backend):
    d = make(backend)
    d.start_request("a", [1, 2, 3, 1, 2])
    d.reset()
    assert d.stats()["active_requests"] == 0 and d.stats()["cached_tokens"] == 0
    d.start_request("a", [1, 2])  # the id is free again
    assert d.speculate("a", 4).tokens == []


def test_same_operations_give_same_drafts(backend):
    rng = np.random.default_rng(1)
    stream = rng.integers(0, 6, size=300).tolist()
    outs = []
    for _ in range(2):
        d = make(backend, max_spec_offset=1.0)
        d.start_request("a", stream[:50])
        got = []
        for k in range(50, 300, 5):
            got.append(as_tuple(d.speculate("a", 7)))
            d.extend_request("a", stream[k : k + 5])
        outs.append(got)
    assert outs[0] == outs[1]


def test_draft_tree_invariants(backend):
    rng = np.random.default_rng(2)
    d = make(backend, max_spec_offset=3.0, min_token_prob=0.05)
    d.start_request("a", rng.integers(0, 4, size=200).tolist())
    for _ in range(40):
        t = d.speculate("a", 9)
        assert len(t.tokens) == len(t.parents) == len(t.probs) <= 9
        assert t.score == pytest.approx(sum(t.probs))
        seen = set()
        for i, (p, q) in enumerate(zip(t.parents, t.probs, strict=True)):
            assert -1 <= p < i and 0.05 <= q <= 1.0
            assert p < 0 or q <= t.probs[p]  # path probabilities never grow
            assert (p, t.tokens[i]) not in seen  # siblings differ
            seen.add((p, t.tokens[i]))
        d.extend_request("a", rng.integers(0, 4, size=2).tolist())


@pytest.mark.skipif(not native_available(), reason="native backend not built")
def test_native_memory_is_reused_after_abort():
    """Freed node slots are reused: a second request of the same size after an
    abort does not grow the memory (it stays at the high-water mark)."""
    d = make("native")
    rng = np.random.default_rng(3)
    d.start_request("big", rng.integers(0, 50000, size=50_000).tolist())
    d.flush()
    first = d.stats()["memory_bytes"]
    d.abort_request("big")
    after = d.stats()
    assert after["global_nodes"] == 0 and after["pinned_tokens"] == 0
    d.start_request("big2", rng.integers(0, 50000, size=50_000).tolist())
    d.flush()
    second = d.stats()
    assert second["global_nodes"] > 50_000
    assert second["memory_bytes"] < first * 1.05
    d.finish_request("big2")
    assert d.stats()["memory_bytes"] < first  # the request's own tree is freed


@pytest.mark.skipif(not native_available(), reason="native backend not built")
def test_native_removed_tokens_stay_pinned_only_while_referenced():
    """Nodes that referred to a removed request keep only the stretch of its
    tokens they spell (a fragment: here b's 29 shared tokens, not its 30)."""
    d = make("native", max_cached_requests=3)
    d.start_request("a", [])
    d.extend_request("a", list(range(1, 30)))
    d.finish_request("a")
    d.start_request("b", [99])
    d.extend_request("b", list(range(1, 30)))  # same text: nodes now refer to b
    d.abort_request("b")
    s = d.stats()
    assert s["cached_tokens"] == 29 and s["pinned_tokens"] == 29  # copied out of b
    assert d._engine._check() == ""
    d.start_request("c", [1, 2, 3, 4, 5])
    assert d.speculate("c", 4).tokens == [6, 7, 8, 9]  # a's copy serves, via b's tokens
    d.finish_request("c")
    for r in "xyz":  # evicts a and c: nothing refers to b any more
        d.start_request(r, [7])
        d.finish_request(r)
    s = d.stats()
    assert s["pinned_tokens"] == 0 and s["cached_tokens"] == 3
    assert d._engine._check() == ""


@pytest.mark.parametrize("merge", [True, False])
def test_merge_local_and_global_drafts(backend, merge):
    d = make(backend, max_depth=8, max_spec_offset=8.0, min_token_prob=0.0, merge_drafts=merge)
    d.start_request("old", [1, 2, 7, 8])
    d.finish_request("old")
    d.start_request("a", [1, 2, 3, 4, 1, 2])
    # own tree: 3 4 1 2 for sure; global tree: 3 ... or 7 8, half each.
    got = as_tuple(d.speculate("a", 6))
    if merge:  # one tree, best nodes first: the own chain, then the global branch
        assert got == ([3, 4, 1, 2, 7, 8], [-1, 0, 1, 2, -1, 4], [1.0] * 4 + [0.5] * 2, 5.0, 2)
    else:  # the higher-scoring draft only
        assert got == ([3, 4, 1, 2], [-1, 0, 1, 2], [1.0] * 4, 4.0, 2)
    # the merged tree respects the budget, dropping the lowest nodes
    assert d.speculate("a", 5).tokens == ([3, 4, 1, 2, 7] if merge else [3, 4, 1, 2])
