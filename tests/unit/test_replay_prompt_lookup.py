"""The plain prompt-lookup baseline drafter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_spec_ext.replay import TraceRecord, greedy_accept, make_drafter, replay
from sglang_spec_ext.replay.prompt_lookup import PromptLookupDrafter


def _naive(tokens: list[int], k: int, max_n: int = 3, min_n: int = 1) -> list[int]:
    """Reference: the most recent earlier occurrence of the longest suffix n-gram."""
    for n in range(max_n, min_n - 1, -1):
        if len(tokens) < n:
            continue
        pat = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == pat:
                return tokens[start + n : start + n + k]
    return []


def test_copies_continuation_of_longest_match() -> None:
    d = PromptLookupDrafter()
    d.start_request("r", [1, 2, 3, 4, 5, 9, 2, 3, 7])
    d.extend_request("r", [8])
    assert d.speculate("r", 4).tokens == []  # 8 never seen before
    d.extend_request("r", [2, 3])
    # 3-gram (8,2,3) absent; 2-gram (2,3) last followed by 7
    draft = d.speculate("r", 4)
    assert draft.tokens == [7, 8, 2, 3] and draft.parents == [-1, 0, 1, 2]
    assert d.speculate("r", 2).tokens == [7, 8]
    assert d.speculate("r", 0).tokens == []
    d.extend_request("r", [4])
    # 3-gram (2,3,4) matches the prompt: continuation 5, 9, ...
    assert d.speculate("r", 3).tokens == [5, 9, 2]


def test_requests_are_independent() -> None:
    d = PromptLookupDrafter()
    d.start_request("a", [1, 2, 3])
    d.start_request("b", [3])
    assert d.speculate("b", 3).tokens == []
    d.finish_request("a")
    d.finish_request("b")
    with pytest.raises(ValueError, match="already started"):
        d.start_request("c", [1])
        d.start_request("c", [1])


def test_bad_ngram_range() -> None:
    with pytest.raises(ValueError):
        PromptLookupDrafter(max_ngram=1, min_ngram=2)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=0, max_size=40),
    st.lists(st.integers(0, 4), min_size=1, max_size=30),
    st.integers(1, 6),
)
def test_matches_naive_reference(prompt: list[int], output: list[int], k: int) -> None:
    d = PromptLookupDrafter()
    d.start_request(0, prompt)
    ctx = list(prompt)
    for tok in output:
        assert d.speculate(0, k).tokens == _naive(ctx, k)
        d.extend_request(0, [tok])
        ctx.append(tok)


def test_repetitive_output_accepts_a_lot() -> None:
    body = list(range(50, 90))
    rec = TraceRecord(prompt_ids=tuple(body), output_ids=tuple(body + [1]))
    res = replay([rec], make_drafter("prompt-lookup"), 16)
    # after the first token, the prompt is copied 15 tokens at a time
    assert res.steps[0][:2] == [16, 16]
    assert res.overall.summary()["accept_len"] > 8
    assert greedy_accept(None, [1]) == 0
