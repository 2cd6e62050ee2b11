"""The host's NGRAM corpus (sglang 0.5.23, C++ via apache-tvm-ffi) as a replay drafter."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang.srt.speculative.cpp_ngram.ngram_corpus")

from sglang_spec_ext.replay import (  # noqa: E402
    DrafterOptions,
    TraceRecord,
    acceptance_table,
    drafter_factory,
    make_drafter,
    replay,
)
from sglang_spec_ext.replay.protocol import Draft, validate_draft  # noqa: E402
from sglang_spec_ext.sglang.host.replay_ngram import HostNgramDrafter, _drop_padding  # noqa: E402

BODY = tuple(range(100, 160))


@pytest.fixture(scope="module")
def drafter8() -> HostNgramDrafter:
    return HostNgramDrafter(width=8)  # builds the JIT module once for the file


def test_selectable_by_name() -> None:
    assert isinstance(make_drafter("ngram", DrafterOptions(width=4)), HostNgramDrafter)


def test_width_below_two_rejected() -> None:
    with pytest.raises(ValueError, match="width >= 2"):
        HostNgramDrafter(width=1)


def test_drop_padding() -> None:
    d = Draft([5, 0, 6, 0, 0], [-1, -1, 0, -1, 1])
    # node 1 (token 0 under the root) has a child, so it is real; node 3 is padding
    kept = _drop_padding(d)
    assert kept.tokens == [5, 0, 6, 0] and kept.parents == [-1, -1, 0, 1]


def test_learns_from_decode_steps_only(drafter8: HostNgramDrafter) -> None:
    d = drafter8
    d.start_request("p", list(BODY))
    d.extend_request("p", [1])  # prefill token: nothing inserted
    assert d.speculate("p", 7).tokens == []  # the prompt itself is never inserted
    d.extend_request("p", [2])  # decode step: inserts the window it drafted from
    d.finish_request("p")
    # a new request whose context ends in the middle of that window now gets drafts
    d.start_request("q", [BODY[-6], BODY[-5]])
    draft = d.speculate("q", 7)
    validate_draft(draft, 7)
    assert draft.tokens[:4] == [BODY[-4], BODY[-3], BODY[-2], BODY[-1]]
    d.finish_request("q")


def test_repeated_text_is_accepted() -> None:
    loop = (5, 6, 7, 8, 9, 10, 11)
    recs = [
        TraceRecord((1,), loop * 8, "loop"),
        TraceRecord((2,), BODY, "copy"),
        TraceRecord((3,), BODY, "copy"),  # seen as the previous output: global corpus
    ]
    res = replay(recs, drafter_factory("ngram", DrafterOptions(width=8)), 8, check=True)
    loop_steps, first, second = res.steps
    assert max(loop_steps) == 8 and len(loop_steps) < len(loop) * 8 // 2
    assert sum(second) == sum(first) == len(BODY) - 1
    assert len(second) < len(first) / 3
    summary = res.overall.summary()
    assert summary["accept_len"] > 2.0
    assert summary["drafted_per_step"] <= 7


def test_acceptance_table_runs_and_is_bounded() -> None:
    recs = [TraceRecord((1,), (5, 6, 7, 8) * 6, "loop")]
    (row,) = acceptance_table(recs, drafter_factory("ngram", DrafterOptions(width=16)), (1, 4, 15))
    assert len(row.accepted) == 24
    for p, accs in enumerate(row.accepted):
        assert all(0 <= a <= min(k, 24 - p) for k, a in zip((1, 4, 15), accs, strict=True))
    assert max(a for accs in row.accepted for a in accs) >= 4
