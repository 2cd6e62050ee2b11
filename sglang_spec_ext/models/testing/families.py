"""Tiny random-weight models of the families users serve, for the model-matrix tests.

Each builder writes a float32 checkpoint plus the project's tiny tokenizer
(:func:`sglang_spec_ext.models.testing.llama.build_tokenizer`) to a directory that
transformers and the SGLang server load (``--model-path DIR``); nothing is downloaded and
nothing here imports SGLang. The configs come from transformers' own config classes, with
the fields SGLang 0.5.23 reads beside them (``sglang/srt/models/<family>.py``) filled in
where transformers does not write them. The same arguments give the same weights, and an
existing directory built with the same arguments is reused.

* :func:`build_tiny_qwen3_moe`: ``Qwen3MoeForCausalLM`` (``qwen3_moe.py``), every layer a
  sparse MoE.
* :func:`build_tiny_gemma3`: ``Gemma3ForCausalLM`` (``gemma3_causal.py``), sliding-window
  layers before one full-attention layer; the window is a parameter, so a test can make it
  shorter than its prompts and outputs (and shorter than a draft).
* :func:`build_tiny_gpt_oss`: ``GptOssForCausalLM`` (``gpt_oss.py``), MoE, sliding window
  and attention sinks.
* :func:`build_tiny_deepseek_v3`: ``DeepseekV3ForCausalLM`` (``deepseek_v2.py``), MLA and
  MoE (first layer dense, as DeepSeek-V3's first layers are), YaRN rope as the real
  checkpoints have (the host's CPU rope supports only that).
* :func:`build_tiny_qwen3_next`: ``Qwen3NextForCausalLM`` (``qwen3_next.py``), Gated
  DeltaNet layers with a full-attention layer every ``full_attention_interval``, MoE.

Which of them the CPU engine serves, and what stops the others, is in ``docs/models.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Heads of 16 dimensions, as the tiny Llama has (``llama.tiny_config_fields``).
HEAD_DIM = 16


def _build_cached(
    model_dir: Path | str, stamp: dict, make: Callable[[Any], tuple[Any, Any]]
) -> Path:
    """Write ``make(tokenizer) -> (config, model class)``'s model, seeded by
    ``stamp["seed"]``, plus the tokenizer to ``model_dir``; reuse a directory whose
    ``SOURCE.txt`` holds the same ``stamp``. ``stamp["tweak"]``, when given, names a
    function run on the model before it is saved: one of this module, or
    ``module.function`` of this package (``mtp_layers.deepseek_nextn``)."""
    import torch

    from sglang_spec_ext.models.testing.llama import (
        build_tokenizer,
        greedy_generation_config,
        save_tokenizer,
    )

    model_dir = Path(model_dir)
    marker = model_dir / "SOURCE.txt"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return model_dir
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config, model_cls = make(tokenizer)
    saved_rng = torch.random.get_rng_state()
    try:
        torch.manual_seed(stamp["seed"])
        model = model_cls(config).to(torch.float32).eval()
        if stamp.get("tweak"):
            _tweak(stamp["tweak"])(model, stamp["seed"])
    finally:
        torch.random.set_rng_state(saved_rng)
    model.generation_config = greedy_generation_config(tokenizer)
    model.save_pretrained(model_dir, safe_serialization=True)
    save_tokenizer(tokenizer, model_dir)
    marker.write_text(json.dumps(stamp) + "\n")
    return model_dir


def _tweak(name: str) -> Callable[[Any, int], None]:
    if "." not in name:
        return globals()[name]
    import importlib

    module, function = name.rsplit(".", 1)
    return getattr(importlib.import_module(f"{__package__}.{module}"), function)


def _fields(tokenizer, hidden_size: int, num_layers: int, initializer_range: float) -> dict:
    from sglang_spec_ext.models.testing.llama import tiny_config_fields

    return tiny_config_fields(tokenizer, hidden_size, num_layers, initializer_range)


def build_tiny_qwen3_moe(
    model_dir: Path | str,
    seed: int = 0,
    *,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_experts: int = 4,
    experts_per_token: int = 2,
    initializer_range: float = 0.1,
) -> Path:
    """A random tiny ``Qwen3MoeForCausalLM``: every layer sparse (``decoder_sparse_step``
    1), ``num_experts`` experts of width ``hidden_size``, ``experts_per_token`` routed per
    token with renormalised weights, QK-norm attention with heads of 16."""
    stamp = {"builder": f"{__name__}.build_tiny_qwen3_moe", "seed": seed, "num_layers": num_layers,
             "hidden_size": hidden_size, "num_experts": num_experts,
             "experts_per_token": experts_per_token, "initializer_range": initializer_range}  # fmt: skip

    def make(tokenizer):
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        config = Qwen3MoeConfig(
            **_fields(tokenizer, hidden_size, num_layers, initializer_range),
            head_dim=HEAD_DIM,
            num_experts=num_experts,
            num_experts_per_tok=experts_per_token,
            moe_intermediate_size=hidden_size,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
        )
        config.architectures = ["Qwen3MoeForCausalLM"]
        return config, Qwen3MoeForCausalLM

    return _build_cached(model_dir, stamp, make)


def build_tiny_gemma3(
    model_dir: Path | str,
    seed: int = 0,
    *,
    sliding_window: int = 16,
    num_layers: int = 2,
    hidden_size: int = 64,
    initializer_range: float = 0.1,
) -> Path:
    """A random tiny ``Gemma3ForCausalLM`` (text only): ``num_layers - 1`` sliding-window
    layers (each query sees its ``sliding_window`` latest tokens, itself included; the
    host's ``sliding_window_size`` is ``sliding_window - 1``) and a last full-attention
    layer, tied embeddings (the host always uses the embedding as the LM head,
    ``gemma3_causal.py``, and skips ``lm_head.weight``).

    Two changes to the random init (:func:`_spread_gemma3`) keep greedy output varied:
    a default random Gemma 3 of this size (embeddings scaled by ``sqrt(hidden)``, tied to
    the LM head, unit norms) repeats one token forever on every prompt tried, which makes
    a parity check trivially true and the window irrelevant. With them its outputs vary
    and differ between a window of 16 and full attention on the prompts the tests send.
    """
    if sliding_window < 1 or num_layers < 2:
        raise ValueError("sliding_window >= 1 and num_layers >= 2 (a full-attention layer)")
    stamp = {"builder": f"{__name__}.build_tiny_gemma3", "seed": seed,
             "sliding_window": sliding_window, "num_layers": num_layers,
             "hidden_size": hidden_size, "initializer_range": initializer_range,
             "tweak": "_spread_gemma3"}  # fmt: skip

    def make(tokenizer):
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        fields = _fields(tokenizer, hidden_size, num_layers, initializer_range)
        fields["tie_word_embeddings"] = True
        config = Gemma3TextConfig(
            **fields,
            head_dim=HEAD_DIM,
            query_pre_attn_scalar=HEAD_DIM,
            sliding_window=sliding_window,
            layer_types=["sliding_attention"] * (num_layers - 1) + ["full_attention"],
        )
        config.architectures = ["Gemma3ForCausalLM"]
        return config, Gemma3ForCausalLM

    return _build_cached(model_dir, stamp, make)


def _spread_gemma3(model: Any, seed: int) -> None:
    """Embeddings divided by ``sqrt(hidden)`` (after the model's own scaling they have
    the other weights' size) and RMS-norm weights drawn from ``N(0, 0.5)`` (Gemma's norms
    multiply by ``1 + weight``: per-channel gains around 1 instead of exactly 1)."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.model.embed_tokens.weight.div_(model.config.hidden_size**0.5)
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)


def build_tiny_gpt_oss(
    model_dir: Path | str,
    seed: int = 0,
    *,
    sliding_window: int = 16,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_experts: int = 4,
    initializer_range: float = 0.1,
) -> Path:
    """A random tiny ``GptOssForCausalLM``: sliding-window and full-attention layers
    alternating (the first sliding), learned attention sinks per head, ``num_experts``
    experts (2 per token), unquantised float32 weights (real checkpoints ship MXFP4)."""
    stamp = {"builder": f"{__name__}.build_tiny_gpt_oss", "seed": seed,
             "sliding_window": sliding_window, "num_layers": num_layers,
             "hidden_size": hidden_size, "num_experts": num_experts,
             "initializer_range": initializer_range}  # fmt: skip

    def make(tokenizer):
        from transformers import GptOssConfig, GptOssForCausalLM

        fields = _fields(tokenizer, hidden_size, num_layers, initializer_range)
        fields["intermediate_size"] = hidden_size
        config = GptOssConfig(
            **fields,
            head_dim=HEAD_DIM,
            num_local_experts=num_experts,
            num_experts_per_tok=2,
            sliding_window=sliding_window,
            layer_types=[("sliding_attention", "full_attention")[i % 2] for i in range(num_layers)],
        )
        config.architectures = ["GptOssForCausalLM"]
        return config, GptOssForCausalLM

    return _build_cached(model_dir, stamp, make)


#: YaRN at factor 1 (frequencies unchanged): the host's CPU rope (``get_rope_cpu`` in
#: ``layers/rotary_embedding/factory.py``) supports only DeepSeek's YaRN, which every real
#: DeepSeek-V3 checkpoint uses.
DEEPSEEK_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 1.0,
                 "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                 "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip
#: DeepSeek-V3 config fields the host reads that transformers' ``DeepseekV3Config`` does
#: not write (values of the real checkpoints' config.json).
DEEPSEEK_EXTRA = {"moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
                  "ep_size": 1, "num_nextn_predict_layers": 0}  # fmt: skip


def build_tiny_deepseek_v3(
    model_dir: Path | str,
    seed: int = 0,
    *,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_experts: int = 4,
    initializer_range: float = 0.1,
    nextn: bool = False,
) -> Path:
    """A random tiny ``DeepseekV3ForCausalLM``: multi-head latent attention (query and KV
    low-rank projections of 32, a decoupled rope part of 16, nope and value heads of 16),
    the first layer dense and the others MoE (``num_experts`` routed experts, 2 per token,
    sigmoid scores with the ``noaux_tc`` bias, one shared expert). The CPU engine serves it
    through the absorbed MLA method (``sglang_spec_ext/sglang/cpu/mla.py``).

    ``nextn``: one NextN MTP layer as DeepSeek ships it (``num_nextn_predict_layers`` 1,
    the layer under ``model.layers.<num_layers>.``: a decoder layer plus ``enorm``,
    ``hnorm``, ``eh_proj`` and ``shared_head.norm``; the embedding and LM head are the
    target's), served by the host as ``DeepseekV3ForCausalLMNextN`` under NEXTN / EAGLE
    or HYBRID. Like the tiny MiMo's (``models/testing/mtp.py``) it copies a target layer
    (the last) and passes the token half of ``eh_proj`` through, so its drafts are
    sometimes right."""
    stamp = {"builder": f"{__name__}.build_tiny_deepseek_v3", "seed": seed,
             "num_layers": num_layers, "hidden_size": hidden_size, "num_experts": num_experts,
             "initializer_range": initializer_range}  # fmt: skip
    if nextn:
        stamp["tweak"] = "mtp_layers.deepseek_nextn"

    def make(tokenizer):
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

        layers = num_layers + (1 if nextn else 0)  # the tweak turns the last into NextN
        config = DeepseekV3Config(
            **_fields(tokenizer, hidden_size, layers, initializer_range),
            moe_intermediate_size=hidden_size,
            n_routed_experts=num_experts,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_rope_head_dim=HEAD_DIM,
            qk_nope_head_dim=HEAD_DIM,
            v_head_dim=HEAD_DIM,
            rope_parameters=dict(DEEPSEEK_ROPE),
        )
        for key, value in DEEPSEEK_EXTRA.items():
            setattr(config, key, value)
        config.architectures = ["DeepseekV3ForCausalLM"]
        return config, DeepseekV3ForCausalLM

    return _build_cached(model_dir, stamp, make)


def build_tiny_qwen3_next(
    model_dir: Path | str,
    seed: int = 0,
    *,
    num_layers: int = 4,
    full_attention_interval: int = 2,
    hidden_size: int = 64,
    num_experts: int = 4,
    initializer_range: float = 0.1,
    mtp: bool = False,
) -> Path:
    """A random tiny ``Qwen3NextForCausalLM``: Gated DeltaNet (linear attention) layers
    with a gated full-attention layer every ``full_attention_interval`` (the host reads
    that field, transformers 5 writes only ``layer_types``), MoE MLPs with a shared
    expert.

    ``mtp``: its MTP layer as Qwen3-Next ships it (``mtp.fc``,
    ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, one full-attention MoE
    decoder layer ``mtp.layers.0`` and ``mtp.norm``; the embedding and head are the
    target's), which the host serves as ``Qwen3NextForCausalLMMTP`` under NEXTN / EAGLE
    or HYBRID. It copies the target's last full-attention layer and passes the token half
    of ``fc`` through (as ``build_tiny_deepseek_v3(nextn=True)``)."""
    stamp = {"builder": f"{__name__}.build_tiny_qwen3_next", "seed": seed,
             "num_layers": num_layers, "full_attention_interval": full_attention_interval,
             "hidden_size": hidden_size, "num_experts": num_experts,
             "initializer_range": initializer_range}  # fmt: skip
    if mtp:
        stamp["tweak"] = "mtp_layers.qwen3_next_mtp"

    def make(tokenizer):
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        layer_types = [
            "full_attention" if (i + 1) % full_attention_interval == 0 else "linear_attention"
            for i in range(num_layers)
        ]
        config = Qwen3NextConfig(
            **_fields(tokenizer, hidden_size, num_layers, initializer_range),
            head_dim=HEAD_DIM,
            layer_types=layer_types,
            num_experts=num_experts,
            num_experts_per_tok=2,
            moe_intermediate_size=hidden_size,
            shared_expert_intermediate_size=hidden_size,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=HEAD_DIM,
            linear_value_head_dim=HEAD_DIM,
            linear_conv_kernel_dim=4,
        )
        config.full_attention_interval = full_attention_interval
        config.architectures = ["Qwen3NextForCausalLM"]
        return config, Qwen3NextForCausalLM

    return _build_cached(model_dir, stamp, make)


#: Family name -> (builder, the host's model module(s) that serve it: what a test server
#: must not put in ``SGLANG_DISABLED_MODEL_ARCHS``).
FAMILIES: dict[str, tuple[Callable[..., Path], tuple[str, ...]]] = {
    "qwen3_moe": (build_tiny_qwen3_moe, ("qwen3_moe",)),
    "gemma3": (build_tiny_gemma3, ("gemma3_causal",)),
    "gpt_oss": (build_tiny_gpt_oss, ("gpt_oss",)),
    "deepseek_v3": (build_tiny_deepseek_v3, ("deepseek_v2", "deepseek_nextn")),
    "qwen3_next": (build_tiny_qwen3_next, ("qwen3_next", "qwen3_next_mtp")),
}
