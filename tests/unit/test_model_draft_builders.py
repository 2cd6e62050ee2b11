"""Locally built drafts for model-draft speculation (sglang_spec_ext/models/testing/llama.py):
a truncated same-vocabulary draft and a random EAGLE3 head in the host's layout."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_spec_ext.models.testing.llama import (
    build_eagle3_head,
    build_tiny_llama,
    build_truncated_draft,
    default_eagle3_aux_layer_ids,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0, num_layers=3)


def test_truncated_draft_is_the_first_layers_of_the_source(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    draft_dir = build_truncated_draft(tiny, tmp_path / "draft", 1)
    source = AutoModelForCausalLM.from_pretrained(tiny).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
    assert draft.config.num_hidden_layers == 1
    assert draft.config.vocab_size == source.config.vocab_size
    assert AutoTokenizer.from_pretrained(draft_dir).get_vocab() == (
        AutoTokenizer.from_pretrained(tiny).get_vocab()
    )
    ids = torch.tensor([[1, 5, 9, 200, 17, 3]])
    source.model.layers = source.model.layers[:1]  # the same truncation, done by hand
    source.config.num_hidden_layers = 1
    with torch.no_grad():
        torch.testing.assert_close(draft(ids).logits, source(ids).logits)
    stamp = (draft_dir / "model.safetensors").stat().st_mtime_ns
    assert build_truncated_draft(tiny, draft_dir, 1) == draft_dir  # cached: not rebuilt
    assert (draft_dir / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="num_layers"):
        build_truncated_draft(tiny, tmp_path / "bad", 4)


def test_layer_skipping_draft_keeps_first_and_last_layers(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    draft_dir = build_truncated_draft(tiny, tmp_path / "skip", 1, keep_last=1)
    source = AutoModelForCausalLM.from_pretrained(tiny).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
    assert draft.config.num_hidden_layers == 2
    layers = source.model.layers
    source.model.layers = torch.nn.ModuleList([layers[0], layers[2]])  # layer 1 skipped
    source.config.num_hidden_layers = 2
    for index, layer in enumerate(source.model.layers):
        layer.self_attn.layer_idx = index
    ids = torch.tensor([[1, 5, 9, 200, 17, 3]])
    with torch.no_grad():
        torch.testing.assert_close(draft(ids).logits, source(ids).logits)
    with pytest.raises(ValueError, match="keep_last"):
        build_truncated_draft(tiny, tmp_path / "bad", 2, keep_last=2)


def test_eagle3_head_has_the_host_draft_layout(tiny, tmp_path):
    from safetensors.torch import load_file

    head = build_eagle3_head(tiny, tmp_path / "head")
    config = json.loads((head / "config.json").read_text())
    target = json.loads((tiny / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == default_eagle3_aux_layer_ids(3) == [-1, 0, 1]
    hidden, vocab = target["hidden_size"], target["vocab_size"]
    weights = load_file(str(head / "model.safetensors"))
    assert weights["model.fc.weight"].shape == (hidden, hidden * len(ids))
    q_out = config["num_attention_heads"] * config["head_dim"]
    assert weights["model.layers.0.self_attn.q_proj.weight"].shape == (q_out, 2 * hidden)
    assert (
        weights["lm_head.weight"].shape == (config["draft_vocab_size"], hidden) == (vocab, hidden)
    )
    assert "model.layers.0.hidden_norm.weight" in weights
    again = build_eagle3_head(tiny, tmp_path / "head")
    assert again == head and torch.equal(
        load_file(str(again / "model.safetensors"))["model.fc.weight"], weights["model.fc.weight"]
    )
    with pytest.raises(ValueError, match="aux_layer_ids"):
        build_eagle3_head(tiny, tmp_path / "bad", aux_layer_ids=[0, 2])


def test_default_aux_layer_ids():
    assert default_eagle3_aux_layer_ids(2) == [-1, 0]
    assert default_eagle3_aux_layer_ids(30) == [0, 14, 28]
    with pytest.raises(ValueError):
        default_eagle3_aux_layer_ids(0)
