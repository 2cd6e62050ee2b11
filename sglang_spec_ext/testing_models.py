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
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    vocab = len(tokenizer)
    padded_vocab = (vocab + 63) // 64 * 64
    num_heads = max(1, hidden_size // 16)
    config = LlamaConfig(
        vocab_size=padded_vocab,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        head_dim=hidden_size // num_heads,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        initializer_range=initializer_range,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config.architectures = ["LlamaForCausalLM"]
    saved_rng = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    finally:
        torch.random.set_rng_state(saved_rng)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    # The generic fast-tokenizer class name loads with transformers 4.x as well as 5.x.
    tok_cfg_path = model_dir / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text())
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (model_dir / "SOURCE.txt").write_text(
        json.dumps({"builder": "sglang_spec_ext.testing_models.build_tiny_llama", "seed": seed})
        + "\n"
    )
    return model_dir
