"""The real SGLang server on CPU serves the tiny model exactly like transformers."""

from __future__ import annotations

import torch

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):",
    "Suffix trees index the text seen so far",
    "for i in range(10):",
]
NEW_TOKENS = 24


def _hf_greedy(model_dir, prompt_ids: list[int], n: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids])
    out = []
    with torch.no_grad():
        for _ in range(n):  # plain argmax loop: no EOS handling, like ignore_eos
            nxt = int(model(ids).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def test_server_greedy_matches_transformers(tiny_model_dir, tiny_baseline_server):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    server = tiny_baseline_server
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        got = server.generate(
            input_ids=ids, max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True
        )["output_ids"]
        want = _hf_greedy(tiny_model_dir, ids, NEW_TOKENS)
        assert got == want, f"prompt {prompt!r}: server {got} != transformers {want}"
    assert server.healthy()
