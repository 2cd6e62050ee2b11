"""Acceptance tables agree with replay and round-trip through their file format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_spec_ext.replay import (
    TraceRecord,
    acceptance_table,
    drafter_factory,
    read_acceptance_table,
    replay,
    simulate_fixed_budget,
    write_acceptance_table,
)

KS = (0, 1, 2, 3, 5, 8)

token_lists = st.lists(st.integers(0, 5), min_size=0, max_size=40)
traces = st.lists(
    st.builds(
        TraceRecord,
        prompt_ids=token_lists.map(tuple),
        output_ids=token_lists.map(tuple),
        set=st.sampled_from(["a", "b"]),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(traces)
def test_fixed_budget_walk_reproduces_replay(records: list[TraceRecord]) -> None:
    factory = drafter_factory("prompt-lookup")
    rows = acceptance_table(records, factory, KS)
    assert [r.set for r in rows] == [r.set for r in records]
    for k in KS:
        res = replay(records, factory, width=k + 1)
        assert [simulate_fixed_budget(row, k) for row in rows] == res.steps


@settings(max_examples=60, deadline=None)
@given(traces)
def test_table_bounds_and_monotone_for_chains(records: list[TraceRecord]) -> None:
    rows = acceptance_table(records, drafter_factory("prompt-lookup"), KS)
    for rec, row in zip(records, rows, strict=True):
        n = len(rec.output_ids)
        assert len(row.accepted) == n
        for p, accs in enumerate(row.accepted):
            for k, a in zip(KS, accs, strict=True):
                assert 0 <= a <= min(k, n - p)
            # prompt-lookup drafts a prefix of one chain: more budget never hurts
            assert list(accs) == sorted(accs)


def test_known_table() -> None:
    rec = TraceRecord(prompt_ids=(1, 2, 3, 4), output_ids=(1, 2, 3, 9), set="x")
    (row,) = acceptance_table([rec], drafter_factory("prompt-lookup"), (1, 2, 4))
    # p=0: ctx ends with 4, never seen before -> nothing
    # p=1: ctx ...4,1 -> (1) followed by 2,3,4 -> vs [2,3,9]: 1, 2, 2
    # p=2: ctx ...1,2 -> (4,1,2)? no; (1,2) -> 3,4 -> vs [3,9]: 1, 1, 1
    # p=3: ctx ...1,2,3 -> (1,2,3) -> 4 -> vs [9]: 0
    assert row.accepted == ((0, 0, 0), (1, 2, 2), (1, 1, 1), (0, 0, 0))
    assert row.column(2) == [0, 2, 1, 0]
    assert simulate_fixed_budget(row, 2) == [3]


def test_file_round_trip(tmp_path: Path) -> None:
    recs = [
        TraceRecord((1, 2, 3), (1, 2, 3, 1, 2), "chat"),
        TraceRecord((5,), (), "code"),
    ]
    rows = acceptance_table(recs, drafter_factory("prompt-lookup"), (1, 4))
    path = tmp_path / "acc.jsonl"
    assert write_acceptance_table(path, rows) == 2
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"set", "ks", "accepted"} and first["ks"] == [1, 4]
    assert read_acceptance_table(path) == rows


def test_bad_table_line(tmp_path: Path) -> None:
    path = tmp_path / "acc.jsonl"
    path.write_text(
        '{"set":"a","ks":[1],"accepted":[[0]]}\n{"set":"a","ks":[1,2],"accepted":[[0]]}\n'
    )
    with pytest.raises(ValueError, match=r"acc\.jsonl:2"):
        read_acceptance_table(path)


def test_bad_ks() -> None:
    with pytest.raises(ValueError):
        acceptance_table([], drafter_factory("prompt-lookup"), ())
