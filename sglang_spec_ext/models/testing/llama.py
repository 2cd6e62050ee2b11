"""A tiny random-weight Llama with a real (locally trained) tokenizer, for tests.

Engine-agnostic: nothing here imports SGLang, and transformers / tokenizers / torch
are imported only when a model is built. Nothing is downloaded: the tokenizer is a
byte-level BPE trained on a short built-in text, so any string encodes and decodes
losslessly, and the weights are drawn from a seeded generator.
"""

from __future__ import annotations

import json
from pathlib import Path

BOS = "<|im_start|>"
EOS = "<|im_end|>"
PAD = "<|endoftext|>"
SPECIAL_TOKENS = (PAD, BOS, EOS)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Training text for the tokenizer: a little prose and a little code, so common
# English and Python fragments get merges of their own.
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A speculative decoder proposes several
tokens and the target model checks all of them in one forward pass. Every proposed
token that matches what the target would have produced is kept, plus one bonus token.
Suffix trees index the text seen so far; the longest matching suffix predicts what comes
next. Repetitive workloads such as code editing, retrieval and agent loops repeat much of
their input, so a model-free draft accepts many tokens there.
Please write a short answer. Here is the summary of the document you asked for.
def add(a, b):
    return a + b

def reverse(items):
    result = []
    for item in items:
        result.insert(0, item)
    return result

class Counter:
    def __init__(self):
        self.count = 0

    def increment(self, step=1):
        self.count += step
        return self.count

for i in range(10):
    print(i, add(i, i))
if __name__ == "__main__":
    import sys
    print("hello world", sys.argv)
"""


def build_tokenizer(vocab_size: int = 384):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with chat specials and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True) * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=PAD,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config_fields(
    tokenizer, hidden_size: int, num_layers: int, initializer_range: float
) -> dict:
    """The config fields every tiny test model shares (Llama- and Qwen2-shaped alike):
    vocabulary padded to a multiple of 64, heads of 16, grouped KV, untied embeddings."""
    num_heads = max(1, hidden_size // 16)
    return dict(
        vocab_size=(len(tokenizer) + 63) // 64 * 64,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        initializer_range=initializer_range,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def greedy_generation_config(tokenizer):
    """A transformers ``GenerationConfig`` with the tokenizer's special ids, greedy."""
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )


def save_tokenizer(tokenizer, model_dir: Path) -> None:
    """Save ``tokenizer`` into ``model_dir`` under the generic fast-tokenizer class name
    (loads with transformers 4.x as well as 5.x)."""
    tokenizer.save_pretrained(model_dir)
    tok_cfg_path = Path(model_dir) / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text())
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")


def build_tiny_llama(
    model_dir: Path | str,
    seed: int = 0,
    *,
    num_layers: int = 2,
    hidden_size: int = 64,
    initializer_range: float = 0.1,
) -> Path:
    """Write a random tiny ``LlamaForCausalLM`` (float32) plus tokenizer to ``model_dir``.

    Loadable by transformers (``AutoModelForCausalLM`` / ``AutoTokenizer``) and by the
    SGLang server (``--model-path model_dir``). The same seed gives the same weights.
    ``initializer_range`` is larger than usual so greedy argmax margins stay far above
    float32 noise (ties would make "identical greedy output" checks flaky).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    dims = tiny_config_fields(tokenizer, hidden_size, num_layers, initializer_range)
    config = LlamaConfig(**dims, head_dim=hidden_size // dims["num_attention_heads"])
    config.architectures = ["LlamaForCausalLM"]
    saved_rng = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    finally:
        torch.random.set_rng_state(saved_rng)
    model.generation_config = greedy_generation_config(tokenizer)
    model.save_pretrained(model_dir, safe_serialization=True)
    save_tokenizer(tokenizer, model_dir)
    (model_dir / "SOURCE.txt").write_text(
        json.dumps(
            {"builder": "sglang_spec_ext.models.testing.llama.build_tiny_llama", "seed": seed}
        )
        + "\n"
    )
    return model_dir


def build_truncated_draft(
    source_dir: Path | str, draft_dir: Path | str, num_layers: int, *, keep_last: int = 0
) -> Path:
    """Save a layer-skipping draft of the Llama-style model in ``source_dir``: its first
    ``num_layers`` decoder layers plus its last ``keep_last`` ones (embeddings, final
    norm and LM head kept), as a model in ``draft_dir``.

    A weaker draft with the source's vocabulary and tokenizer, for model-draft
    speculation (``--speculative-draft-model-path``). Keeping a few final layers
    matters: the LM head reads what they produce (SmolLM2-135M's first 20 layers alone
    agree with it on under 4% of next tokens; its first 14 plus last 8 on about a
    quarter). Cached: an existing ``draft_dir`` built the same way is reused.
    """
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    source_dir, draft_dir = Path(source_dir), Path(draft_dir)
    stamp = {
        "builder": "sglang_spec_ext.models.testing.llama.build_truncated_draft",
        "source": str(source_dir.resolve()),
        "num_layers": num_layers,
        "keep_last": keep_last,
    }
    marker = draft_dir / "SOURCE.txt"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return draft_dir
    model = AutoModelForCausalLM.from_pretrained(source_dir, dtype=torch.float32)
    layers = model.model.layers
    total = len(layers)
    if num_layers < 1 or keep_last < 0 or num_layers + keep_last > total:
        raise ValueError(
            f"num_layers ({num_layers}) >= 1 and keep_last ({keep_last}) >= 0 must "
            f"together keep at most the source's {total} layers"
        )
    keep = list(range(num_layers)) + list(range(total - keep_last, total))
    model.model.layers = torch.nn.ModuleList(layers[i] for i in keep)
    for index, layer in enumerate(model.model.layers):
        if hasattr(layer.self_attn, "layer_idx"):
            layer.self_attn.layer_idx = index
    model.config.num_hidden_layers = len(keep)
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = [model.config.layer_types[i] for i in keep]
    tmp = draft_dir.with_name(draft_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in source_dir.iterdir():  # tokenizer files, chat template
        if name.is_file() and ("token" in name.name or name.suffix == ".jinja"):
            shutil.copy2(name, tmp / name.name)
    (tmp / "SOURCE.txt").write_text(json.dumps(stamp) + "\n")
    shutil.rmtree(draft_dir, ignore_errors=True)
    tmp.rename(draft_dir)
    return draft_dir


def default_eagle3_aux_layer_ids(num_target_layers: int) -> list[int]:
    """Target layers whose outputs feed an EAGLE3 head (``-1``: the embeddings).

    The host captures the input of layer ``id + 1``, so ids run from -1 to
    ``num_layers - 2``: a low, a middle and a high one where the model is deep enough.
    """
    if num_target_layers < 1:
        raise ValueError("the target needs at least one layer")
    if num_target_layers <= 3:
        return list(range(-1, num_target_layers - 1))
    return [0, num_target_layers // 2 - 1, num_target_layers - 2]


def build_eagle3_head(
    target_dir: Path | str,
    head_dir: Path | str,
    seed: int = 0,
    *,
    aux_layer_ids: list[int] | None = None,
    initializer_range: float = 0.1,
) -> Path:
    """Write a random-weight EAGLE3 draft head for the Llama-style model in ``target_dir``.

    The checkpoint follows the host's draft architecture (``LlamaForCausalLMEagle3``,
    ``sglang/srt/models/llama_eagle3.py``): one decoder layer whose attention takes the
    token embedding and the projected target features side by side (``2 * hidden``
    inputs), an ``fc`` projecting the concatenated target hidden states of
    ``aux_layer_ids`` (``eagle_config.eagle_aux_hidden_state_layer_ids``), a final norm
    and an LM head over the target's full vocabulary (no ``d2t`` map). Random weights:
    enough for lossless-output tests (parity needs no good head), not for acceptance.
    Cached: an existing ``head_dir`` built from the same inputs is reused.
    """
    import torch
    from safetensors.torch import save_file

    target_dir, head_dir = Path(target_dir), Path(head_dir)
    target = json.loads((target_dir / "config.json").read_text())
    layers = int(target["num_hidden_layers"])
    ids = list(aux_layer_ids) if aux_layer_ids is not None else default_eagle3_aux_layer_ids(layers)
    if not ids or any(not -1 <= i <= layers - 2 for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"aux_layer_ids must be distinct values in -1..{layers - 2}, got {ids}")
    stamp = {
        "builder": "sglang_spec_ext.models.testing.llama.build_eagle3_head",
        "target": str(target_dir.resolve()),
        "seed": seed,
        "aux_layer_ids": ids,
        "initializer_range": initializer_range,
    }
    marker = head_dir / "SOURCE.txt"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return head_dir

    hidden = int(target["hidden_size"])
    heads = int(target["num_attention_heads"])
    kv_heads = int(target.get("num_key_value_heads") or heads)
    head_dim = int(target.get("head_dim") or hidden // heads)
    inter = int(target["intermediate_size"])
    vocab = int(target["vocab_size"])
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": target.get("hidden_act", "silu"),
        "max_position_embeddings": target.get("max_position_embeddings", 4096),
        "rms_norm_eps": target.get("rms_norm_eps", 1e-5),
        "rope_theta": target.get("rope_theta", 10000.0),
        "vocab_size": vocab,
        "draft_vocab_size": vocab,
        "target_hidden_size": hidden,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": target.get("bos_token_id"),
        "eos_token_id": target.get("eos_token_id"),
        "pad_token_id": target.get("pad_token_id"),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
    }
    if "rope_parameters" in target:
        config["rope_parameters"] = target["rope_parameters"]
    g = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * initializer_range

    layer = "model.layers.0"
    tensors = {
        "model.embed_tokens.weight": normal(vocab, hidden),
        "model.fc.weight": normal(hidden, hidden * len(ids)),
        f"{layer}.self_attn.q_proj.weight": normal(heads * head_dim, 2 * hidden),
        f"{layer}.self_attn.k_proj.weight": normal(kv_heads * head_dim, 2 * hidden),
        f"{layer}.self_attn.v_proj.weight": normal(kv_heads * head_dim, 2 * hidden),
        f"{layer}.self_attn.o_proj.weight": normal(hidden, heads * head_dim),
        f"{layer}.mlp.gate_proj.weight": normal(inter, hidden),
        f"{layer}.mlp.up_proj.weight": normal(inter, hidden),
        f"{layer}.mlp.down_proj.weight": normal(hidden, inter),
        f"{layer}.input_layernorm.weight": torch.ones(hidden),
        f"{layer}.hidden_norm.weight": torch.ones(hidden),
        f"{layer}.post_attention_layernorm.weight": torch.ones(hidden),
        "model.norm.weight": torch.ones(hidden),
        "lm_head.weight": normal(vocab, hidden),
    }
    head_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(head_dir / "model.safetensors"))
    (head_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in target_dir.iterdir():  # the target's tokenizer (the host may read it)
        if name.is_file() and ("token" in name.name or name.suffix == ".jinja"):
            (head_dir / name.name).write_bytes(name.read_bytes())
    marker.write_text(json.dumps(stamp) + "\n")
    return head_dir
