"""MTP drafts' shared embedding and LM head on the CPU engine.

An MTP draft (DeepSeek's NextN, Qwen3-Next's MTP, GLM-4 MoE's, ...) takes the target's
embedding and LM head: the host's EAGLE worker calls the draft model's
``set_embed_and_head``, which the draft classes inherit from their targets. Those swap
the two weights and then call ``torch.cuda.empty_cache()`` and
``torch.cuda.synchronize()``: on a CPU-only torch that raises ("Torch not compiled with
CUDA enabled") while the draft worker allocates its pools, so no MTP draft of these
families starts on the CPU engine. :func:`set_embed_and_head` does the same swap and
nothing else (there is nothing to free or wait for on a CPU). Installed only on the CPU
engine, for the classes in :data:`TARGETS` (each read from the host's source: a swap
followed by those two calls).
"""

from __future__ import annotations

from typing import Any

_MODELS = "sglang.srt.models"
#: The host's target classes whose ``set_embed_and_head`` ends in CUDA calls and whose
#: MTP drafts inherit it.
TARGETS = (
    f"{_MODELS}.deepseek_v2.DeepseekV2ForCausalLM.set_embed_and_head",
    f"{_MODELS}.qwen3_next.Qwen3NextForCausalLM.set_embed_and_head",
    f"{_MODELS}.glm4_moe.Glm4MoeForCausalLM.set_embed_and_head",
    f"{_MODELS}.bailing_moe.BailingMoEForCausalLM.set_embed_and_head",
)


def set_embed_and_head(self: Any, embed: Any, head: Any) -> None:
    """REPLACE for those ``set_embed_and_head``: the host's swap of the embedding and LM
    head weights, without its CUDA cache release and sync."""
    del self.model.embed_tokens.weight
    del self.lm_head.weight
    self.model.embed_tokens.weight = embed
    self.lm_head.weight = head


def install_mtp_heads_cpu() -> list[str]:
    """Register :func:`set_embed_and_head` on every :data:`TARGETS` class (applied when
    its model module is imported)."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once([(t, set_embed_and_head, HookType.REPLACE) for t in TARGETS])
    return ["cpu_mtp_embed_head"]
