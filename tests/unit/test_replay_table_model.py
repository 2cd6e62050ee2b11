"""Acceptance tables of model-draft chains read from traces."""

from __future__ import annotations

import pytest

from sglang_spec_ext.replay.table import model_draft_table
from sglang_spec_ext.replay.trace import ModelDrafts, TraceRecord


def _record(output: list[int], chains: list[list[int]]) -> TraceRecord:
    drafts = ModelDrafts(
        k=3, tokens=tuple(map(tuple, chains)), probs=tuple((0.5,) * 3 for _ in chains)
    )
    return TraceRecord(
        prompt_ids=(1, 2), output_ids=tuple(output), set="s", model_drafts={"d": drafts}
    )


def test_chain_acceptance_is_the_leading_match_capped_by_k() -> None:
    out = [5, 6, 7, 8]
    chains = [[5, 6, 9], [6, 7, 8], [7, 0, 0], [9, 9, 9]]
    (row,) = model_draft_table([_record(out, chains)], "d")
    assert row.ks == (1, 2, 3)
    # p=0: proposal [5,6,9] vs [5,6,7,8] -> 2; p=1: [6,7,8] vs [6,7,8] -> 3;
    # p=2: [7,..] vs [7,8] -> 1; p=3: miss
    assert row.accepted == ((1, 2, 2), (1, 2, 3), (1, 1, 1), (0, 0, 0))


def test_missing_draft_is_named() -> None:
    with pytest.raises(ValueError, match="no model draft 'other'"):
        model_draft_table([_record([1], [[1, 1, 1]])], "other")
