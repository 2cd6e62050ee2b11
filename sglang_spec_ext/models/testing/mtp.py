"""A tiny random-weight MiMo-shaped model with its multi-token-prediction (MTP) layer, for tests.

MiMo (``MiMoForCausalLM``, the host's ``sglang/srt/models/mimo.py``) is Qwen2 decoder
layers plus, in the same checkpoint, ``num_nextn_predict_layers`` MTP layers under
``model.mtp_layers.<i>.``. The host serves them as ``--speculative-algorithm NEXTN``
(or ``EAGLE``): loaded as a draft, the architecture becomes ``MiMoMTP``
(``srt/configs/model_config.py``; ``srt/models/mimo_mtp.py``), which reads only the MTP
layer (and shares the target's embedding and LM head). One MTP layer is::

    h' = input_proj([hidden_layernorm(h_t), token_layernorm(embed(x_{t+1}))])
    h'' = final_layernorm(mtp_block(h'))      # mtp_block: one Qwen2 decoder layer
    logits(x_{t+2}) = lm_head(h'')

Checkpoint names (what ``MiMoMTP.load_weights`` maps): ``model.mtp_layers.0.`` +
``token_layernorm``, ``hidden_layernorm``, ``input_proj`` (``[H, 2H]``),
``final_layernorm``, and the decoder layer's own ``input_layernorm``,
``post_attention_layernorm``, ``self_attn.{q,k,v}_proj.{weight,bias}``,
``self_attn.o_proj.weight``, ``mlp.{gate,up,down}_proj.weight``. The target's loader
(``MiMoForCausalLM.load_weights``) skips every ``mtp_layers`` name.

The config is a ``qwen2`` config (``model_type`` ``qwen2``, so transformers and the host
read it without remote code; real MiMo checkpoints say ``mimo`` and ship their config
class) with ``architectures = ["MiMoForCausalLM"]`` and ``num_nextn_predict_layers = 1``.

A random MTP layer is almost never right, so by default the MTP layer *shares* the
target's weights cheaply (``share_target_layer``): its decoder layer is a copy of one
target layer, ``input_proj`` passes the token half through and drops the hidden half,
``token_layernorm`` restores the embedding's scale and ``final_layernorm`` copies the
target's final norm. With the default one-layer target the draft is then the target
itself run one token ahead (its first two tokens unseen): offline, on greedy output of
the default model, it names the target's next-but-one token about 65% of the time, so
drafts are accepted and rejected both. With two layers and the MTP layer copying layer
0 it agrees about 5% of the time; an all-random MTP layer (``share_target_layer=None``)
never did. Nothing imports SGLang here; nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

MTP_PREFIX = "model.mtp_layers.0."


def build_tiny_mimo_mtp(
    model_dir: Path | str,
    seed: int = 0,
    *,
    num_layers: int = 1,
    hidden_size: int = 64,
    initializer_range: float = 0.1,
    share_target_layer: int | None = 0,
) -> Path:
    """Write a random tiny MiMo target (float32) with one MTP layer plus tokenizer to ``model_dir``.

    Servable as a plain model (``--model-path model_dir``) and with its MTP layer as the
    draft (``--speculative-algorithm NEXTN``, with or without
    ``--speculative-draft-model-path model_dir``). ``share_target_layer``: the target layer
    the MTP decoder layer copies (see the module docstring), or ``None`` for an all-random
    MTP layer. Cached: an existing ``model_dir`` built with the same arguments is reused.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sglang_spec_ext.models.testing.llama import (
        build_tokenizer,
        greedy_generation_config,
        save_tokenizer,
        tiny_config_fields,
    )

    model_dir = Path(model_dir)
    if share_target_layer is not None and not 0 <= share_target_layer < num_layers:
        raise ValueError(f"share_target_layer must be in 0..{num_layers - 1} or None")
    stamp = {
        "builder": "sglang_spec_ext.models.testing.mtp.build_tiny_mimo_mtp",
        "seed": seed,
        "num_layers": num_layers,
        "hidden_size": hidden_size,
        "initializer_range": initializer_range,
        "share_target_layer": share_target_layer,
    }
    marker = model_dir / "SOURCE.txt"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return model_dir
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        **tiny_config_fields(tokenizer, hidden_size, num_layers, initializer_range),
        use_sliding_window=False,
    )
    saved_rng = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        target = Qwen2ForCausalLM(config).to(torch.float32).eval()
        tensors = {k: v.detach().clone() for k, v in target.state_dict().items()}
        tensors.update(_mtp_layer(tensors, hidden_size, initializer_range, share_target_layer))
    finally:
        torch.random.set_rng_state(saved_rng)

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(model_dir / "model.safetensors"))
    cfg = config.to_dict()
    cfg.update(architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1, torch_dtype="float32")
    cfg.pop("dtype", None)
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    greedy_generation_config(tokenizer).save_pretrained(model_dir)
    save_tokenizer(tokenizer, model_dir)
    marker.write_text(json.dumps(stamp) + "\n")
    return model_dir


def _mtp_layer(target: dict, hidden: int, scale: float, share: int | None) -> dict:
    """The ``model.mtp_layers.0.*`` tensors (see the module docstring)."""
    import torch

    layer_keys = {
        k.removeprefix("model.layers.0."): v.shape
        for k, v in target.items()
        if k.startswith("model.layers.0.")
    }
    out: dict[str, torch.Tensor] = {}
    if share is None:
        for name, shape in layer_keys.items():
            out[MTP_PREFIX + name] = (
                torch.ones(shape) if "norm" in name else torch.randn(shape) * scale
            )
        out[MTP_PREFIX + "input_proj.weight"] = torch.randn(hidden, 2 * hidden) * scale
        for norm in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
            out[f"{MTP_PREFIX}{norm}.weight"] = torch.ones(hidden)
        return out
    for name in layer_keys:
        out[MTP_PREFIX + name] = target[f"model.layers.{share}.{name}"].clone()
    # Token half passed through, hidden half dropped: [hidden_layernorm(h), token_layernorm(e)].
    out[MTP_PREFIX + "input_proj.weight"] = torch.cat(
        (torch.zeros(hidden, hidden), torch.eye(hidden)), dim=1
    )
    # token_layernorm normalises the embedding to RMS 1: scale it back to the embedding's
    # own RMS, so the copied layer sees inputs of the size it was built for.
    embed_rms = target["model.embed_tokens.weight"].pow(2).mean().sqrt()
    out[MTP_PREFIX + "token_layernorm.weight"] = torch.full((hidden,), float(embed_rms))
    out[MTP_PREFIX + "hidden_layernorm.weight"] = torch.ones(hidden)
    out[MTP_PREFIX + "final_layernorm.weight"] = target["model.norm.weight"].clone()
    return out
