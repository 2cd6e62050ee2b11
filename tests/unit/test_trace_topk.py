"""The trace format's optional ``target_topk``: round trips and validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_spec_ext.replay import TraceError, TraceRecord, read_trace, write_trace
from sglang_spec_ext.replay.trace import parse_record

OUT = (11, 12, 13)
TOPK = ((12, 40, 41), (13, 42, 43), (2, 44, 45))


def test_round_trip_through_json_and_files(tmp_path: Path) -> None:
    rec = TraceRecord((1, 2), OUT, "chat", target_topk=TOPK)
    assert rec.topk_k == 3
    line = rec.to_json()
    assert line["target_topk"] == [list(r) for r in TOPK]
    assert parse_record(json.loads(json.dumps(line))) == rec
    plain = TraceRecord((1, 2), OUT, "chat")
    path = tmp_path / "t.jsonl"
    write_trace(path, [rec, plain])
    back = read_trace(path)
    assert back == [rec, plain]
    assert back[0].target_topk == TOPK and back[1].target_topk == () and back[1].topk_k == 0


def test_absent_when_empty_and_lists_become_tuples() -> None:
    assert "target_topk" not in TraceRecord((1,), OUT).to_json()
    assert "target_topk" not in TraceRecord((1,), ()).to_json()
    rec = TraceRecord((1,), OUT, target_topk=[list(r) for r in TOPK])  # type: ignore[arg-type]
    assert rec.target_topk == TOPK
    assert parse_record({"prompt_ids": [1], "output_ids": [], "target_topk": []}).target_topk == ()


def _line(topk: object) -> dict:
    return {"prompt_ids": [1], "output_ids": list(OUT), "target_topk": topk}


@pytest.mark.parametrize(
    ("topk", "message"),
    [
        ("abc", "must be a list of rows"),
        ([[12, 40], [13, 42]], "has 2 rows, expected one per output token \\(3\\)"),
        ([], "has 0 rows"),
        ([[12, 40], [13, 42, 43], [2, 44]], r'"target_topk"\[1\] has 3 tokens, expected k = 2'),
        ([[], [], []], "at least one token"),
        ([[12], 13, [2]], r'"target_topk"\[1\] must be a list'),
        ([[12], [13.0], [2]], "not a non-negative integer"),
        ([[12], [True], [2]], "not a non-negative integer"),
        ([[12], [13], [-2]], r'"target_topk"\[2\] holds -2'),
        ([[12], ["13"], [2]], "not a non-negative integer"),
    ],
)
def test_bad_topk_is_rejected(topk: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_record(_line(topk))


def test_bad_topk_in_a_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = json.dumps(TraceRecord((1,), OUT, target_topk=TOPK).to_json())
    path.write_text(good + "\n" + json.dumps(_line([[12], [13]])) + "\n")
    with pytest.raises(TraceError, match=r"bad\.jsonl:2: .*target_topk"):
        read_trace(path)


def test_a_record_built_in_code_is_checked_too() -> None:
    with pytest.raises(ValueError, match="expected one per output token"):
        TraceRecord((1,), OUT, target_topk=TOPK[:2])
    with pytest.raises(ValueError, match="expected k = 3"):
        TraceRecord((1,), OUT, target_topk=(TOPK[0], TOPK[1], (2,)))
