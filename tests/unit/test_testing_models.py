"""The tiny random Llama used by host and end-to-end tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from sglang_spec_ext.models.testing.llama import build_tiny_llama


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tiny_llama_loads_and_generates(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = build_tiny_llama(tmp_path / "m", seed=0)
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 2
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    assert len(tok) <= cfg["vocab_size"]

    text = "def add(a, b):\n    return a + b  # naïve 😀"
    assert tok.decode(tok(text)["input_ids"]) == text
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "hello"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    assert tok.decode(enc["input_ids"][0]).endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert out.shape[1] == enc["input_ids"].shape[1] + 8


def test_tiny_llama_is_deterministic(tmp_path: Path) -> None:
    a = build_tiny_llama(tmp_path / "a", seed=3)
    b = build_tiny_llama(tmp_path / "b", seed=3)
    c = build_tiny_llama(tmp_path / "c", seed=4)
    for name in ("model.safetensors", "tokenizer.json"):
        assert _digest(a / name) == _digest(b / name)
    assert _digest(a / "model.safetensors") != _digest(c / "model.safetensors")
