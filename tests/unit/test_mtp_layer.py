"""The torch MTP layer (sglang_spec_ext/models/mtp_layer.py): checkpoint names the host maps,
batched offline chains equal per-prefix decoding, and training improves it."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one thread (two spin against each other on a loaded 2-core machine:
    the training test took 84 s instead of 3)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_mimo(tmp_path_factory):
    from sglang_spec_ext.models.mtp_layer import load_mimo_checkpoint
    from sglang_spec_ext.models.testing.mtp import build_tiny_mimo_mtp

    model_dir = build_tiny_mimo_mtp(tmp_path_factory.mktemp("mimo") / "m", seed=0, num_layers=2)
    return model_dir, *load_mimo_checkpoint(model_dir)


def _ids(n: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def test_checkpoint_round_trip_uses_the_host_names(tiny_mimo):
    from safetensors.torch import load_file

    from sglang_spec_ext.models.mtp_layer import MTP_PREFIX

    model_dir, _, mtp = tiny_mimo
    saved = {k: v for k, v in load_file(str(model_dir / "model.safetensors")).items()
             if k.startswith(MTP_PREFIX)}  # fmt: skip
    mine = mtp.mtp_state_dict()
    assert set(mine) == set(saved)
    for key in saved:
        assert torch.equal(mine[key], saved[key]), key
    own = {k.removeprefix(MTP_PREFIX).split(".")[0] for k in mine}
    assert {"token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm"} <= own


@pytest.mark.parametrize("k", [1, 3])
def test_batched_chains_equal_per_prefix_decoding(tiny_mimo, k):
    from sglang_spec_ext.models.mtp_layer import mtp_chains, naive_mtp_chains

    _, target, mtp = tiny_mimo
    ids = _ids(28, target.config.vocab_size, seed=k)
    fast = mtp_chains(target, mtp, ids, 4, k)
    slow = naive_mtp_chains(target, mtp, ids, 4, k)
    assert fast[0] == slow[0]
    assert len(fast[0]) == len(ids) - 4 and all(len(row) == k for row in fast[0])
    worst = max(
        abs(a - b)
        for ra, rb in zip(fast[1], slow[1], strict=True)
        for a, b in zip(ra, rb, strict=True)
    )
    assert worst < 1e-5


def test_chain_start_must_leave_a_hidden_state(tiny_mimo):
    from sglang_spec_ext.models.mtp_layer import mtp_chains

    _, target, mtp = tiny_mimo
    with pytest.raises(ValueError, match="start"):
        mtp_chains(target, mtp, [1, 2, 3], 1, 2)


def test_position_zero_token_is_masked_like_the_host(tiny_mimo):
    """The host zeroes the token embedding at position 0 (MiMoMultiTokenPredictorLayer)."""
    _, target, mtp = tiny_mimo
    h = torch.randn(1, 1, target.config.hidden_size)
    pos = torch.zeros(1, 1, dtype=torch.long)
    with torch.inference_mode():
        a = mtp(h, torch.tensor([[5]]), pos)
        b = mtp(h, torch.tensor([[9]]), pos)
        c = mtp(h, torch.tensor([[9]]), pos + 1)
    assert torch.equal(a, b) and not torch.equal(b, c)


def test_untied_target_needs_its_head():
    from transformers import Qwen2Config

    from sglang_spec_ext.models.mtp_layer import MTPLayer

    cfg = Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)  # fmt: skip
    with pytest.raises(ValueError, match="lm_head"):
        MTPLayer(cfg, torch.nn.Embedding(50, 16))


def test_training_raises_step1_agreement_on_a_learnable_target():
    """A target whose text is periodic: the token after next is predictable, and a few
    dozen steps take the layer's agreement with the target from chance to most."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sglang_spec_ext.models.mtp_layer import for_target
    from sglang_spec_ext.models.mtp_training import (
        TrainConfig,
        extract_samples,
        step1_agreement,
        train_mtp,
    )

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      use_sliding_window=False)  # fmt: skip
    target = Qwen2ForCausalLM(cfg).eval()
    rng = random.Random(0)
    seqs = []
    for _ in range(24):
        cycle = [rng.randrange(64) for _ in range(5)]
        seqs.append((cycle * 10, 0))  # the whole sequence counts as "output"
    samples = extract_samples(target, seqs, top_k=4)
    before = step1_agreement(for_target(target).eval(), samples)["rate"]
    trained = train_mtp(target, samples, TrainConfig(epochs=12, tokens_per_step=300, lr=1e-2,
                                                     warmup_steps=5))  # fmt: skip
    after = step1_agreement(trained, samples)["rate"]
    assert after > max(0.5, before + 0.3), (before, after)
    assert all(not p.requires_grad for p in target.parameters())
