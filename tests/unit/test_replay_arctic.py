"""The ArcticInference suffix-cache adapter (skipped where arctic-inference is absent)."""

from __future__ import annotations

import pytest

from sglang_spec_ext.replay import (
    DrafterOptions,
    TraceRecord,
    acceptance_table,
    drafter_factory,
    replay,
    simulate_fixed_budget,
)
from sglang_spec_ext.replay.arctic import arctic_available

pytestmark = pytest.mark.skipif(not arctic_available(), reason="arctic-inference not installed")

LOOP = (5, 6, 7, 8, 9, 10, 11, 12)
BODY = tuple(range(100, 150))
RECORDS = [
    TraceRecord((1, 2) + LOOP, LOOP * 5, "loop"),
    TraceRecord(BODY, BODY[:30] + (3, 4), "copy"),
    TraceRecord((9,), BODY[10:40], "global"),  # continues an earlier response
]


@pytest.mark.parametrize("width", [2, 8, 16])
def test_drafts_are_valid_and_replay_matches_table(width: int) -> None:
    factory = drafter_factory("arctic", DrafterOptions(width=width))
    res = replay(RECORDS, factory, width, check=True)
    rows = acceptance_table(RECORDS, factory, [width - 1])
    assert [simulate_fixed_budget(r, width - 1) for r in rows] == res.steps


def test_repetition_is_accepted() -> None:
    res = replay(RECORDS, drafter_factory("arctic", DrafterOptions(width=16)), 16)
    assert res.by_set["loop"].summary()["accept_len"] > 3
    assert res.by_set["copy"].summary()["accept_len"] > 3
    assert res.by_set["global"].summary()["accept_len"] > 2


def test_chain_mode() -> None:
    opts = DrafterOptions(width=16, use_tree=False)
    res = replay(RECORDS, drafter_factory("arctic", opts), 16, check=True)
    assert res.overall.summary()["accept_len"] > 2
