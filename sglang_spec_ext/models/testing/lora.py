"""Small random LoRA adapters for the tiny test model, in PEFT's on-disk format.

Engine-agnostic like :mod:`sglang_spec_ext.models.testing.llama`: nothing here imports SGLang,
peft is not needed (the files are written directly with safetensors) and nothing is
downloaded. An adapter is a directory with ``adapter_config.json`` and
``adapter_model.safetensors`` whose keys follow PEFT's naming
(``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight``, ``lora_A`` of
shape ``(r, in)``, ``lora_B`` of shape ``(out, r)``). ``lora_B`` is nonzero (PEFT
initialises it to zero, which would leave the model unchanged), so every adapter changes
the greedy output; the same seed gives the same weights.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

#: Llama projections an adapter can target, and which module each belongs to.
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
DEFAULT_TARGET_MODULES: tuple[str, ...] = _ATTN + _MLP


def _projection_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """``module -> (in_features, out_features)`` for a Llama config."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    inter = config["intermediate_size"]
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def build_lora_adapter(
    model_dir: Path | str,
    adapter_dir: Path | str,
    seed: int,
    *,
    rank: int = 8,
    alpha: int = 16,
    target_modules: Sequence[str] = DEFAULT_TARGET_MODULES,
    std: float = 0.1,
) -> Path:
    """Write a random LoRA adapter for the Llama at ``model_dir`` into ``adapter_dir``.

    ``lora_A`` and ``lora_B`` are drawn from ``N(0, std)`` with a seeded generator, so
    the update ``(alpha / rank) * B @ A`` has entries of about ``std`` for the defaults:
    the size of the tiny model's own weights (``initializer_range`` 0.1), enough to move
    greedy argmaxes without ties. Returns ``adapter_dir``.
    """
    import torch
    from safetensors.torch import save_file

    model_dir, adapter_dir = Path(model_dir), Path(adapter_dir)
    config = json.loads((model_dir / "config.json").read_text())
    shapes = _projection_shapes(config)
    unknown = sorted(set(target_modules) - set(shapes))
    if unknown:
        raise ValueError(f"unknown target modules {unknown}; known: {sorted(shapes)}")
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(config["num_hidden_layers"]):
        for module in target_modules:
            block = "self_attn" if module in _ATTN else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            fan_in, fan_out = shapes[module]
            a = torch.randn((rank, fan_in), generator=gen, dtype=torch.float32) * std
            b = torch.randn((fan_out, rank), generator=gen, dtype=torch.float32) * std
            tensors[f"{prefix}.lora_A.weight"] = a.contiguous()
            tensors[f"{prefix}.lora_B.weight"] = b.contiguous()
    adapter_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(adapter_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": list(target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_dora": False,
        "use_rslora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }
    (adapter_dir / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
    (adapter_dir / "SOURCE.txt").write_text(
        json.dumps(
            {"builder": "sglang_spec_ext.models.testing.lora.build_lora_adapter", "seed": seed}
        )
        + "\n"
    )
    return adapter_dir


def reference_lora_generate(
    model_dir: Path | str, adapter_dir: Path | str | None, input_ids: Sequence[int], n: int
) -> list[int]:
    """Greedy ``n`` tokens from transformers with the adapter merged into the weights
    (``W += (alpha / r) * B @ A``): an engine-independent reference for the adapter."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if adapter_dir is not None:
        adapter_dir = Path(adapter_dir)
        cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
        scaling = cfg["lora_alpha"] / cfg["r"]
        tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
        params = dict(model.named_parameters())
        with torch.no_grad():
            for key, a in tensors.items():
                if ".lora_A." not in key:
                    continue
                b = tensors[key.replace(".lora_A.", ".lora_B.")]
                name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
                params[name] += scaling * (b @ a)
    ids = list(input_ids)
    with torch.no_grad():  # plain argmax loop: no EOS handling, like ignore_eos
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(input_ids) :]
