"""Token recycling in the replay (``suffix-recycle``, ``recycle-only``): it drafts text the
suffix trees never saw, equals the suffix drafter without top-k rows, and feeds each row
only once the verify step that computed it has committed it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_spec_ext import cli
from sglang_spec_ext.replay import (
    DRAFTER_NAMES,
    DrafterOptions,
    TraceRecord,
    drafter_factory,
    make_drafter,
    replay,
    write_trace,
)
from sglang_spec_ext.replay.recycle import RecycleDrafter
from sglang_spec_ext.suffix.recycler import Recycler

BASE, VOCAB = 1000, 200
#: Rank offsets of a token's top-k rows: its successor in the warm-up request is the
#: token one further on (rank 0 there), in the new request the one seven further on.
WARM_OFFSETS = (1, 7, 2, 3, 4, 5, 6, 8)
NEW_OFFSETS = (7, 1, 2, 3, 4, 5, 6, 8)


def _tok(i: int) -> int:
    return BASE + i % VOCAB


def _walk(start: int, step: int, offsets: tuple[int, ...], label: str) -> TraceRecord:
    """Every token of the vocabulary once, each followed by the one ``step`` further on;
    its top-k row holds that next token at rank 0 (as greedy decoding does)."""
    out = tuple(_tok(start + step * i) for i in range(VOCAB))
    topk = tuple(tuple(_tok(t - BASE + o) for o in offsets) for t in out)
    return TraceRecord((1, 2, 3), out, label, target_topk=topk)


def _records() -> list[TraceRecord]:
    # 7 is coprime to VOCAB: the new walk visits every token once, and none of its
    # transitions (x -> x + 7) occurs in the warm-up text (x -> x + 1) or before in its own
    return [_walk(0, 1, WARM_OFFSETS, "warm-up"), _walk(3, 7, NEW_OFFSETS, "new")]


def test_registered_by_name() -> None:
    assert {"suffix-recycle", "recycle-only"} <= set(DRAFTER_NAMES)
    both = make_drafter("suffix-recycle", DrafterOptions(recycle_k=4, recycle_max_depth=5))
    assert isinstance(both, RecycleDrafter) and both.suffix is not None
    assert both.recycler.config.k == 4 and both.recycler.config.max_depth == 5
    alone = make_drafter("recycle-only")
    assert isinstance(alone, RecycleDrafter) and alone.suffix is None
    with pytest.raises(ValueError, match="bad recycle setting"):
        make_drafter("recycle-only", DrafterOptions(recycle_k=0))
    # as the server: the suffix min_token_prob unless a recycle one is given
    assert (
        make_drafter("recycle-only", DrafterOptions(min_token_prob=0.1)).recycler.config.min_prob
        == 0.1
    )
    explicit = DrafterOptions(min_token_prob=0.1, recycle_min_prob=0.05)
    assert make_drafter("recycle-only", explicit).recycler.config.min_prob == 0.05


@pytest.mark.parametrize("width", [8, 16])
def test_recycling_drafts_text_the_suffix_trees_never_saw(width: int) -> None:
    records = _records()
    accept = {}
    for name in ("suffix", "suffix-recycle", "recycle-only"):
        res = replay(records, drafter_factory(name, DrafterOptions(width=width)), width, check=True)
        accept[name] = res.by_set["new"].summary()["accept_len"]
    assert accept["suffix"] < 1.1  # its drafts follow the warm-up text: x -> x + 1
    assert accept["suffix-recycle"] > accept["suffix"] + 1.0, accept
    assert accept["recycle-only"] > accept["suffix"] + 1.0, accept


RECORDS = [  # no target_topk anywhere
    TraceRecord((1, 2, 5, 6, 7, 8), (5, 6, 7, 8) * 5, "loop"),
    TraceRecord(tuple(range(100, 150)), tuple(range(100, 130)) + (3, 4), "copy"),
    TraceRecord((9,), tuple(range(110, 140)), "global"),
]


@pytest.mark.parametrize("width", [2, 8, 16])
def test_without_topk_it_is_the_suffix_drafter(width: int) -> None:
    opts = DrafterOptions(width=width)
    plain = replay(RECORDS, drafter_factory("suffix", opts), width)
    merged = replay(RECORDS, drafter_factory("suffix-recycle", opts), width, check=True)
    assert merged.steps == plain.steps
    alone = replay(RECORDS, drafter_factory("recycle-only", opts), width, check=True)
    assert alone.overall.drafted == 0


class _Spy(Recycler):
    """A recycler that logs what the drafter calls, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple] = []

    def observe(self, rid, scope, before, committed) -> None:  # noqa: ANN001
        self.log.append(("observe", before, tuple(committed)))
        super().observe(rid, scope, before, committed)

    def feed(self, scope, tokens, topk) -> None:  # noqa: ANN001
        self.log.append(("feed", tuple(int(t) for t in tokens), tuple(map(tuple, topk.tolist()))))
        super().feed(scope, tokens, topk)

    def draft(self, rids, scopes, roots, suffix_trees, budget):  # noqa: ANN001, ANN201
        self.log.append(("draft", int(roots[0])))
        return super().draft(rids, scopes, roots, suffix_trees, budget)


def test_each_row_is_fed_after_the_step_that_computed_it() -> None:
    rec = TraceRecord(
        (1, 2), (5, 6, 7, 8) * 6, "loop", target_topk=tuple((t + 1, t + 50) for t in (5, 6, 7, 8) * 6)
    )  # fmt: skip
    spy = _Spy()
    drafter = RecycleDrafter(make_drafter("suffix"), recycler=spy)
    res = replay([rec], drafter, 8, check=True)
    out, topk = rec.output_ids, rec.target_topk
    expected: list[tuple] = [("observe", rec.prompt_ids[-1], out[:1])]  # prefill: no feed
    pos = 1
    for commit in res.steps[0]:
        expected.append(("draft", out[pos - 1]))
        expected.append(("observe", out[pos - 1], out[pos : pos + commit]))
        # the root's row and the accepted drafts' rows, not the newest token's
        expected.append(("feed", out[pos - 1 : pos + commit - 1], topk[pos - 1 : pos + commit - 1]))
        pos += commit
    assert spy.log == expected
    assert sum(res.steps[0]) == len(out) - 1 and max(res.steps[0]) > 1  # some drafts accepted
    fed = 0  # when a step drafts below the token at position q, rows 0..q-1 are in, not q's
    for entry in spy.log:
        if entry[0] == "feed":
            fed += len(entry[1])
        elif entry[0] == "draft":
            assert out[fed] == entry[1]
    assert drafter.rows_fed == len(out) - 1


def test_the_first_draft_has_no_recycled_nodes() -> None:
    """Prefill is not a verify step: its token's row is not in the table yet."""
    rec = _records()[0]
    drafter = make_drafter("recycle-only")
    drafter.prepare("r", rec)
    drafter.start_request("r", rec.prompt_ids)
    drafter.extend_request("r", rec.output_ids[:1])
    assert len(drafter.speculate("r", 15)) == 0
    drafter.extend_request("r", rec.output_ids[1:2])
    assert drafter.recycler.table.rows_fed == 1
    drafter.finish_request("r")


def test_simulate_accepts_the_new_drafters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, _records())
    for name in ("suffix-recycle", "recycle-only"):
        report = tmp_path / f"{name}.json"
        argv = ["simulate", "--trace", str(trace), "--drafter", name, "--width", "8"]
        assert cli.main([*argv, "--no-progress", "--json", str(report)]) == 0
        assert "recycle_rows_fed" in report.read_text()
    assert "drafter=recycle-only" in capsys.readouterr().out


def test_the_grammar_wrapper_passes_the_rows_on() -> None:
    """``simulate --tokenizer`` wraps the drafter (replay/grammar.py): its ``prepare``
    reaches the recycled source too."""
    from sglang_spec_ext.replay.grammar import GrammarShaped

    wrapper = GrammarShaped.__new__(GrammarShaped)  # no tokenizer needed for prepare
    wrapper.inner, wrapper._constraints = make_drafter("recycle-only"), {}
    rec = _records()[0]
    wrapper.prepare("r", rec)
    wrapper.inner.start_request("r", rec.prompt_ids)
    wrapper.inner.extend_request("r", rec.output_ids[:1])
    wrapper.inner.extend_request("r", rec.output_ids[1:3])
    assert wrapper.inner.rows_fed == 2
