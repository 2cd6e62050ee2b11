"""Workload generation of ``sglang-spec-ext bench``: scenarios, loads, prompts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sglang_spec_ext.bench import workload as wl


def test_presets_and_custom_scenarios() -> None:
    assert wl.parse_scenario("translation") == wl.Scenario("translation", 2048, 2048)
    assert wl.parse_scenario("generation") == wl.Scenario("generation", 256, 2048)
    assert wl.parse_scenario("summarization") == wl.Scenario("summarization", 2048, 256)
    assert wl.parse_scenario("chat:100:50") == wl.Scenario("chat", 100, 50)
    for bad in ("nope", "x:1", "x:a:2", "x:0:5", ":1:2"):
        with pytest.raises(ValueError):
            wl.parse_scenario(bad)


def test_scale_keeps_at_least_one_token() -> None:
    sc = wl.Scenario("t", 2048, 256).scaled(0.05)
    assert (sc.input_len, sc.output_len) == (102, 13)
    assert wl.Scenario("t", 10, 3).scaled(0.01) == wl.Scenario("t", 1, 1)


def test_rates_concurrency_and_labels() -> None:
    rates = wl.parse_rates("1, 4,inf")
    assert rates[:2] == [1.0, 4.0] and math.isinf(rates[2])
    loads = wl.loads_from(rates, wl.parse_ints("1,4"))
    assert [ld.label for ld in loads] == ["rate=1", "rate=4", "rate=inf", "conc=1", "conc=4"]
    assert loads[2].to_json() == {"kind": "rate", "value": "inf"}
    with pytest.raises(ValueError):
        wl.parse_rates("0")
    with pytest.raises(ValueError):
        wl.parse_ints("0,2")


def test_poisson_arrivals() -> None:
    assert wl.poisson_arrivals(3, math.inf, 0) == [0.0, 0.0, 0.0]
    a = wl.poisson_arrivals(4000, 10.0, seed=1)
    assert a == wl.poisson_arrivals(4000, 10.0, seed=1)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:], strict=False))
    assert 9.0 < len(a) / a[-1] < 11.0  # mean rate


def test_random_token_prompts_have_exact_lengths_and_are_seeded() -> None:
    src = wl.PromptSource("random", vocab=range(10, 20))
    sc = wl.Scenario("s", 33, 7)
    reqs = src.build(sc, 5, seed=3)
    assert len(reqs) == 5
    assert all(r.input_len == 33 and r.output_len == 7 for r in reqs)
    assert all(10 <= t < 20 for r in reqs for t in r.prompt_ids)
    assert reqs == src.build(sc, 5, seed=3)
    assert reqs != src.build(sc, 5, seed=4)


class WordTokenizer:
    """Stand-in tokenizer: one token per character."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 128 for c in text]

    def __len__(self) -> int:
        return 128


def test_random_words_exact_with_tokenizer_and_text_without() -> None:
    sc = wl.Scenario("w", 50, 4)
    with_tok = wl.PromptSource("random-words", tokenizer=WordTokenizer()).build(sc, 3, 0)
    assert all(r.input_len == 50 and r.prompt_text is None for r in with_tok)
    text = wl.PromptSource("random-words").build(sc, 2, 0)
    assert all(r.prompt_ids is None and len(r.prompt_text.split()) == 50 for r in text)
    assert all(w in wl.WORDS for w in text[0].prompt_text.split())


def test_dataset_prompts(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    lines = [{"prompt_ids": [1, 2, 3]}, {"prompt": "hello"}, {"prompt_ids": [4], "output_ids": [5]}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    reqs = wl.read_dataset(path)
    assert reqs[0].prompt_ids == (1, 2, 3) and reqs[1].prompt_text == "hello"
    assert wl.read_dataset(path, WordTokenizer())[1].prompt_ids == tuple(ord(c) for c in "hello")
    src = wl.PromptSource("dataset", dataset=reqs)
    built = src.build(wl.Scenario("d", 999, 6), 5, seed=0)
    assert len(built) == 5 and all(r.output_len == 6 for r in built)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        wl.read_dataset(bad)


def test_vocab_ids_sources(tmp_path: Path) -> None:
    assert wl.vocab_ids(size=5) == [0, 1, 2, 3, 4]
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 7}))
    assert wl.vocab_ids(model_path=str(tmp_path)) == list(range(7))
    assert wl.vocab_ids(model_path=str(tmp_path / "missing")) is None

    class Tok:
        all_special_ids = [0, 2]

        def __len__(self) -> int:
            return 5

    assert wl.vocab_ids(Tok()) == [1, 3, 4]
    with pytest.raises(ValueError):
        wl.PromptSource("random", vocab=None)


class ChatTokenizer(WordTokenizer):
    """Stand-in chat tokenizer: the turns joined, one token per character."""

    def apply_chat_template(self, messages, **_kw) -> list[int]:
        return self.encode("".join(f"<{m['role']}>{m['content']}" for m in messages))


def test_mixed_prompts_repeat_a_few_long_texts_and_need_a_tokenizer() -> None:
    from sglang_spec_ext.bench.demo_workloads import MIXED_KINDS, mixed_prompts

    sc = wl.Scenario("m", 0, 9)
    reqs = wl.PromptSource("mixed", tokenizer=ChatTokenizer()).build(sc, 16, 0)
    assert len(reqs) == 16 and all(r.output_len == 9 and r.prompt_ids for r in reqs)
    kinds = [k for k, _ in mixed_prompts(ChatTokenizer(), 16)]
    assert kinds == list(MIXED_KINDS) * 2
    # agent loops share their long system turn and tool-call shape: long repeated text
    agents = [ids for k, ids in mixed_prompts(ChatTokenizer(), 16) if k == "agent"]
    assert agents[0][:200] == agents[1][:200]
    assert reqs == wl.PromptSource("mixed", tokenizer=ChatTokenizer()).build(sc, 16, 0)
    with pytest.raises(ValueError, match="tokenizer"):
        wl.PromptSource("mixed")


def test_structured_prompts_carry_their_constraint_to_the_native_payload() -> None:
    import json

    from sglang_spec_ext.bench.client import _payload
    from sglang_spec_ext.bench.structured_workloads import STRUCTURED_KINDS, TOOLS

    sc = wl.Scenario("s", 0, 32)
    reqs = wl.PromptSource("structured", tokenizer=ChatTokenizer()).build(sc, 8, 0)
    assert reqs == wl.PromptSource("structured", tokenizer=ChatTokenizer()).build(sc, 8, 0)
    by_kind = dict(zip(STRUCTURED_KINDS, reqs, strict=True))
    tool = dict(by_kind["tool"].constraint)
    names = {alt["properties"]["name"]["const"] for alt in json.loads(tool["json_schema"])["anyOf"]}
    assert names == set(TOOLS)
    assert "regex" in dict(by_kind["regex"].constraint) and by_kind["chat"].constraint == ()
    _, body = _payload(by_kind["tool"], "native", False, 0.0, None)
    assert body["sampling_params"]["json_schema"] == tool["json_schema"]
    assert body["sampling_params"]["ignore_eos"] is False  # the grammar ends the request
    _, free = _payload(by_kind["chat"], "native", False, 0.0, None)
    assert (
        free["sampling_params"]["ignore_eos"] is True
        and "json_schema" not in free["sampling_params"]
    )
    with pytest.raises(ValueError, match="native"):
        _payload(by_kind["tool"], "openai", False, 0.0, None)
    with pytest.raises(ValueError, match="tokenizer"):
        wl.PromptSource("structured")
