"""The family builders of ``sglang_spec_ext/models/testing/families.py``: the config fields
SGLang 0.5.23 reads, reuse of a built directory, and greedy output that is not one token
repeated (what makes a parity check and a sliding window mean something)."""

from __future__ import annotations

import json

import pytest

from sglang_spec_ext.models.testing.families import (
    DEEPSEEK_EXTRA,
    FAMILIES,
    build_tiny_gemma3,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("families")
    return {name: builder(root / name) for name, (builder, _) in FAMILIES.items()}


def _config(path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_every_family_writes_weights_tokenizer_and_its_architecture(built):
    archs = {
        "qwen3_moe": "Qwen3MoeForCausalLM",
        "gemma3": "Gemma3ForCausalLM",
        "gpt_oss": "GptOssForCausalLM",
        "deepseek_v3": "DeepseekV3ForCausalLM",
        "qwen3_next": "Qwen3NextForCausalLM",
    }
    assert set(built) == set(archs)
    for name, path in built.items():
        config = _config(path)
        assert config["architectures"] == [archs[name]], name
        assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
        assert config["vocab_size"] % 64 == 0 and config["hidden_size"] == 64, name


def test_host_fields_transformers_does_not_write(built):
    gemma = _config(built["gemma3"])
    assert gemma["sliding_window"] == 16 and gemma["tie_word_embeddings"] is True
    assert gemma["layer_types"] == ["sliding_attention", "full_attention"]
    deepseek = _config(built["deepseek_v3"])
    assert {k: deepseek[k] for k in DEEPSEEK_EXTRA} == DEEPSEEK_EXTRA
    assert deepseek["rope_parameters"]["rope_type"] == "yarn"  # the host's CPU rope needs it
    assert _config(built["qwen3_next"])["full_attention_interval"] == 2
    assert _config(built["qwen3_moe"])["num_local_experts"] == 4  # read as num_experts


def test_a_built_directory_is_reused_and_other_arguments_rebuild(tmp_path):
    path = build_tiny_gemma3(tmp_path / "g", sliding_window=8)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_gemma3(tmp_path / "g", sliding_window=8) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    build_tiny_gemma3(tmp_path / "g", sliding_window=4)
    assert _config(path)["sliding_window"] == 4


def test_gemma3_greedy_output_varies_and_depends_on_the_window(built, tmp_path):
    """A default random Gemma 3 of this size repeats one token on every prompt; the
    builder's init gives varied output that a 16-token window changes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    full = build_tiny_gemma3(tmp_path / "full", sliding_window=4096)
    tok = AutoTokenizer.from_pretrained(built["gemma3"])
    ids = torch.tensor([tok(", ".join(str(i) for i in range(40)))["input_ids"]])

    def greedy(path) -> list[int]:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=24, do_sample=False)
        return out[0, ids.shape[1] :].tolist()

    windowed = greedy(built["gemma3"])
    assert len(set(windowed)) >= 8, windowed
    assert windowed != greedy(full)
