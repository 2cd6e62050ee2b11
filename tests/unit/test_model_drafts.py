"""Batched greedy draft chains (benchmarks/model_drafts.py) equal per-position
incremental decoding on a tiny random Llama."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "model_drafts.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("model_drafts_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from sglang_spec_ext.models.testing.llama import build_tiny_llama

    model_dir = build_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama", seed=3, num_layers=2)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model


def _ids(n: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


@pytest.mark.parametrize(("length", "start", "k"), [(24, 9, 4), (12, 1, 3), (6, 5, 5)])
def test_batched_chains_equal_incremental_decoding(tiny, length, start, k):
    mod = _load_script()
    torch.set_num_threads(1)
    ids = _ids(length, 300, seed=length)
    tokens, probs = mod.greedy_chains(tiny, ids, start, k)
    ref_tokens, ref_probs = mod.naive_chains(tiny, ids, start, k)
    assert len(tokens) == len(ids) - start and all(len(t) == k for t in tokens)
    assert tokens == ref_tokens
    for row, ref in zip(probs, ref_probs, strict=True):
        assert row == pytest.approx(ref, abs=1e-4)
        assert all(0.0 < p <= 1.0 for p in row)
    # The chains depend on the context (a mask leaking other positions' tokens would
    # be visible): not every position proposes the same chain.
    if len(tokens) > 4:
        assert len({tuple(t) for t in tokens}) > 1
        assert len({t[-1] for t in tokens}) > 1


def test_depth_one_is_the_next_token_argmax_and_record_shape(tiny):
    mod = _load_script()
    ids = _ids(16, 300, seed=7)
    with torch.inference_mode():
        logits = tiny(input_ids=torch.tensor([ids])).logits[0]
    tokens, _ = mod.greedy_chains(tiny, ids, 4, 1)
    assert [t[0] for t in tokens] == logits[3:-1].argmax(-1).tolist()
    entry = mod.record_drafts(tiny, ids[:4], ids[4:], 3)
    assert entry["k"] == 3 and len(entry["tokens"]) == 12
    assert all(p == round(p, 3) for row in entry["probs"] for p in row)
    assert mod.draft_name(14, 8) == "smollm2-l14+8"
    with pytest.raises(ValueError):
        mod.greedy_chains(tiny, ids, 0, 2)
