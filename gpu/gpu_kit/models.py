"""Model folders for ``--load-format dummy`` (a ``config.json`` is all the host reads with
``--skip-tokenizer-init``) and the token-id prompts the stages send."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

_LLAMA3 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
    "vocab_size": 128256,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "attention_bias": False,
    "mlp_bias": False,
    "initializer_range": 0.02,
    "use_cache": True,
}

#: Geometries by name: Llama-3-8B and Llama-3.2-1B shapes, a small draft with the same
#: vocabulary (HYBRID's model draft), and tiny ones for the CPU rehearsal (``--dry``).
GEOMETRIES: dict[str, dict[str, Any]] = {
    "llama3-8b": {**_LLAMA3, "hidden_size": 4096, "intermediate_size": 14336,
                  "num_hidden_layers": 32, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False},
    "llama3-1b": {**_LLAMA3, "hidden_size": 2048, "intermediate_size": 8192,
                  "num_hidden_layers": 16, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": True},
    "draft-2l": {**_LLAMA3, "hidden_size": 1024, "intermediate_size": 4096,
                 "num_hidden_layers": 2, "num_attention_heads": 16,
                 "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": True},
    "tiny": {**_LLAMA3, "vocab_size": 2048, "bos_token_id": 1, "eos_token_id": 2,
             "max_position_embeddings": 4096, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "tie_word_embeddings": True},
    "tiny-draft": {**_LLAMA3, "vocab_size": 2048, "bos_token_id": 1, "eos_token_id": 2,
                   "max_position_embeddings": 4096, "hidden_size": 32,
                   "intermediate_size": 64, "num_hidden_layers": 1,
                   "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                   "tie_word_embeddings": True},
}  # fmt: skip


def write_model_dir(root: Path, geometry: str, dtype: str = "bfloat16") -> Path:
    """``root/geometry/config.json`` (idempotent); returns the folder."""
    config = {**GEOMETRIES[geometry], "torch_dtype": dtype}
    path = root / geometry
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    (path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]})
    )
    return path


def weight_bytes(geometry: str, bytes_per: int) -> int:
    """Parameter bytes of a geometry (embeddings, attention, MLP, norms, head)."""
    g = GEOMETRIES[geometry]
    h, i, n, v = g["hidden_size"], g["intermediate_size"], g["num_hidden_layers"], g["vocab_size"]
    d, q, kv = g["head_dim"], g["num_attention_heads"], g["num_key_value_heads"]
    per_layer = h * d * (q + 2 * kv) + q * d * h + 3 * h * i + 2 * h
    head = 0 if g["tie_word_embeddings"] else v * h
    return (v * h + n * per_layer + h + head) * bytes_per


def kv_bytes_per_token(geometry: str, bytes_per: int) -> int:
    g = GEOMETRIES[geometry]
    return 2 * g["num_hidden_layers"] * g["num_key_value_heads"] * g["head_dim"] * bytes_per


def prompts(
    count: int, length: int, vocab: int, *, seed: int = 0, repeat: int = 4
) -> list[list[int]]:
    """``count`` prompts of ``length`` token ids in [100, vocab - 100): a random segment
    of ``length / repeat`` ids repeated, so suffix and n-gram drafters find matches in
    the prompt; each prompt differs (no shared radix-cache prefix)."""
    rng = random.Random(seed)
    out = []
    seg_len = max(1, length // max(1, repeat))
    for _ in range(count):
        seg = [rng.randrange(100, vocab - 100) for _ in range(seg_len)]
        out.append((seg * (length // seg_len + 1))[:length])
    return out
