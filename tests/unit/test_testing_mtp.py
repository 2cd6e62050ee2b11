"""The tiny MiMo-shaped model with its MTP layer (sglang_spec_ext/models/testing/mtp.py), without the host."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_spec_ext.models.testing.mtp import MTP_PREFIX, build_tiny_mimo_mtp


@pytest.fixture(scope="module")
def mimo(tmp_path_factory):
    return build_tiny_mimo_mtp(tmp_path_factory.mktemp("mimo") / "m", seed=0)


def test_config_names_mimo_with_one_mtp_layer(mimo):
    config = json.loads((mimo / "config.json").read_text())
    assert config["architectures"] == ["MiMoForCausalLM"]
    assert config["model_type"] == "qwen2" and config["num_nextn_predict_layers"] == 1
    assert config["num_hidden_layers"] == 1 and not config["tie_word_embeddings"]


def test_mtp_layer_shares_the_target_layer_and_passes_the_token_half(mimo):
    from safetensors.torch import load_file

    w = load_file(str(mimo / "model.safetensors"))
    hidden = json.loads((mimo / "config.json").read_text())["hidden_size"]
    target_layer = {k.removeprefix("model.layers.0."): v for k, v in w.items()
                    if k.startswith("model.layers.0.")}  # fmt: skip
    assert "self_attn.q_proj.bias" in target_layer  # Qwen2 layers carry q/k/v biases
    for name, value in target_layer.items():
        torch.testing.assert_close(w[MTP_PREFIX + name], value)
    proj = w[MTP_PREFIX + "input_proj.weight"]
    assert proj.shape == (hidden, 2 * hidden)
    torch.testing.assert_close(proj[:, hidden:], torch.eye(hidden))
    assert not proj[:, :hidden].any()
    torch.testing.assert_close(w[MTP_PREFIX + "final_layernorm.weight"], w["model.norm.weight"])
    for norm in ("token_layernorm", "hidden_layernorm"):
        assert w[f"{MTP_PREFIX}{norm}.weight"].shape == (hidden,)


def test_target_loads_in_transformers_and_the_build_is_cached(mimo):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(mimo).eval()  # qwen2; the MTP names unused
    ids = AutoTokenizer.from_pretrained(mimo)("hello world", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert model(ids).logits.shape[-1] == model.config.vocab_size
    stamp = (mimo / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_mimo_mtp(mimo, seed=0) == mimo
    assert (mimo / "model.safetensors").stat().st_mtime_ns == stamp


def test_random_mtp_layer_and_bad_shared_layer(tmp_path):
    from safetensors.torch import load_file

    d = build_tiny_mimo_mtp(tmp_path / "r", num_layers=2, share_target_layer=None)
    w = load_file(str(d / "model.safetensors"))
    assert not torch.equal(
        w[MTP_PREFIX + "mlp.up_proj.weight"], w["model.layers.0.mlp.up_proj.weight"]
    )
    with pytest.raises(ValueError, match="share_target_layer"):
        build_tiny_mimo_mtp(tmp_path / "bad", num_layers=1, share_target_layer=1)
