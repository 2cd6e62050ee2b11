"""Grammar-aware drafts in the offline replay (replay/grammar.py, ``simulate --tokenizer``):
trace records with a constraint, shaped drafts with exact accept lengths, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_spec_ext import cli
from sglang_spec_ext.replay import TraceError, TraceRecord, read_trace, write_trace
from sglang_spec_ext.replay.drafters import make_drafter
from sglang_spec_ext.replay.engine import replay

xg = pytest.importorskip("xgrammar")

SCHEMA = json.dumps({
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "kelvin"]},
                   "days": {"type": "integer"}},
    "required": ["city", "unit", "days"],
})  # fmt: skip
ANSWERS = [
    {"city": "Paris", "unit": "celsius", "days": 3},
    {"city": "Oslo", "unit": "kelvin", "days": 2},
    {"city": "Rome", "unit": "celsius", "days": 5},
]


@pytest.fixture(scope="module")
def tiny_tok(tmp_path_factory) -> str:
    from sglang_spec_ext.models.testing.llama import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tok") / "tiny", seed=0))


def _records(tok_path: str) -> list[TraceRecord]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_path)
    out = []
    for i, answer in enumerate(ANSWERS):
        prompt = tok.encode(f"Weather call number {i}:", add_special_tokens=False)
        text = json.dumps(answer, indent=2)
        ids = tok.encode(text, add_special_tokens=False)
        out.append(
            TraceRecord(tuple(prompt), tuple(ids), "tool", constraint={"json_schema": SCHEMA})
        )
    out.append(TraceRecord((5, 6, 7), (8, 9, 8, 9, 8, 9), "chat"))  # unconstrained
    return out


def test_grammar_shaped_replay_drafts_the_structure(tiny_tok: str) -> None:
    """First requests: the suffix trees know nothing, so plain SUFFIX accepts little;
    shaped drafts carry the forced structure (braces, newlines, keys) and the enum's values,
    so the accept length rises; the unconstrained request replays as before."""
    from sglang_spec_ext.replay.grammar import GrammarShaped

    recs = _records(tiny_tok)
    plain = replay(recs, make_drafter("suffix"), 16)
    shaped_drafter = GrammarShaped(make_drafter("suffix"), tiny_tok)
    shaped = replay(recs, shaped_drafter, 16, check=True)
    tool_plain = plain.by_set["tool"].summary()["accept_len"]
    tool_shaped = shaped.by_set["tool"].summary()["accept_len"]
    print(
        f"\naccept length, constrained requests: plain {tool_plain:.2f}, shaped {tool_shaped:.2f}"
    )
    assert tool_shaped > tool_plain + 0.5
    stats = shaped_drafter.stats
    assert stats.forced > 0 and stats.requests > 0 and stats.branched > 0
    assert shaped.by_set["chat"].steps == plain.by_set["chat"].steps
    assert not shaped_drafter._reqs  # every request finished and dropped


def test_trace_constraints_round_trip_and_bad_input(tmp_path: Path, tiny_tok: str) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, _records(tiny_tok))
    back = read_trace(path)
    assert back[0].constraint == {"json_schema": SCHEMA} and back[-1].constraint is None
    for bad, msg in [({"grammar": "x"}, "unknown kind"), ({"regex": ""}, "non-empty"),
                     ({"regex": "a", "ebnf": "b"}, "one of"), ("a", "one of")]:  # fmt: skip
        line = json.dumps({"prompt_ids": [1], "output_ids": [2], "constraint": bad})
        (tmp_path / "bad.jsonl").write_text(line + "\n")
        with pytest.raises(TraceError, match=msg):
            read_trace(tmp_path / "bad.jsonl")


def test_an_output_its_constraint_rejects_is_a_clear_error(tiny_tok: str) -> None:
    from sglang_spec_ext.replay.grammar import GrammarShaped

    rec = _records(tiny_tok)[0]
    wrong = TraceRecord(rec.prompt_ids, rec.output_ids, "tool", constraint={"regex": "[0-9]+"})
    with pytest.raises(ValueError, match="breaks the record's constraint"):
        replay([wrong], GrammarShaped(make_drafter("suffix"), tiny_tok), 8)
    with pytest.raises(ValueError, match="--tokenizer"):
        GrammarShaped(make_drafter("suffix"), "/nonexistent/tokenizer")


def test_simulate_cli_with_and_without_tokenizer(tmp_path: Path, tiny_tok: str, capsys) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, _records(tiny_tok))
    assert cli.main(["simulate", "--trace", str(path), "--no-progress"]) == 0
    assert "pass --tokenizer" in capsys.readouterr().err
    out = tmp_path / "r.json"
    argv = ["simulate", "--trace", str(path), "--no-progress", "--tokenizer", tiny_tok,
            "--json", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["grammar_tokenizer"] == tiny_tok
    assert report["grammar_drafts"]["forced"] > 0
