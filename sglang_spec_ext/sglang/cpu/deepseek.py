"""The DeepSeek family (MLA, NextN MTP) on the CPU engine.

**MLA on ``torch_native``.**
The host picks an MLA model's attention method per forward from a handler per backend
(``srt/models/deepseek_common/attention_backend_handler.py``). ``torch_native`` has
none, so it gets the triton handler, whose fresh prefills take the MHA method: queries
of ``qk_nope + qk_rope`` per head against the MLA pool's keys, which hold the latent
(``kv_lora_rank + qk_rope``) -- ``torch_native`` fails there at the first prefill
(``Expected size for first two dimensions of batch2 tensor``).

The absorbed MLA method (the host's ``forward_absorb``, what it runs for decode and
target verify on every backend, and for everything under deterministic inference) is
plain multi-query attention over the latent: queries ``kv_lora_rank + qk_rope`` wide
(``w_kc`` folded in), one KV head holding the pool's row (the key) and its first
``kv_lora_rank`` columns (the value), written with the pool's own ``set_kv_buffer``.
``torch_native`` runs exactly that. :func:`install_mla_handler` registers a
``torch_native`` handler choosing it for every forward (the host's own subtype
dispatch, so an AMX CPU keeps its fused-rope method).

**The NextN draft's shared embedding and head.** A NextN (MTP) draft takes the target's
embedding and LM head through ``set_embed_and_head``, which in
``DeepseekV2ForCausalLM`` ends with ``torch.cuda.empty_cache()`` and
``torch.cuda.synchronize()``: on a CPU-only torch that raises ("Torch not compiled with
CUDA enabled") while the draft worker allocates its pools. :func:`set_embed_and_head`
does the same swap and then what the platform has (nothing to free or wait for on CPU).

Both are installed only on the CPU engine (``install_deepseek_cpu``).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("sglang_spec_ext")

HANDLER_MODULE = "sglang.srt.models.deepseek_common.attention_backend_handler"
BACKEND = "torch_native"


def handle_attention_torch_native(attn: Any, forward_batch: Any) -> Any:
    """The absorbed MLA method for every ``torch_native`` forward."""
    import importlib

    handler = importlib.import_module(HANDLER_MODULE)
    return handler._dispatch_mla_subtype(attn, forward_batch)


#: The DeepSeek model class whose embedding/head swap calls CUDA.
EMBED_HEAD_TARGET = "sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM.set_embed_and_head"


def set_embed_and_head(self: Any, embed: Any, head: Any) -> None:
    """REPLACE for ``DeepseekV2ForCausalLM.set_embed_and_head``: the host's swap of the
    embedding and LM head weights, without its CUDA cache release and sync."""
    del self.model.embed_tokens.weight
    del self.lm_head.weight
    self.model.embed_tokens.weight = embed
    self.lm_head.weight = head


def _install_mla_handler() -> list[str]:
    import importlib

    try:
        handler = importlib.import_module(HANDLER_MODULE)
    except ImportError as exc:  # a host without the DeepSeek family
        logger.debug("MLA on torch_native: %s", exc)
        return []
    registry = handler.AttentionBackendRegistry
    if BACKEND in registry._handlers:
        return []
    registry.register(BACKEND, handle_attention_torch_native)
    return ["cpu_mla_torch_native"]


def install_deepseek_cpu() -> list[str]:
    """Register :func:`handle_attention_torch_native` with the host's registry (where the
    host has none of its own for ``torch_native``) and the CPU ``set_embed_and_head``."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once([(EMBED_HEAD_TARGET, set_embed_and_head, HookType.REPLACE)])
    return [*_install_mla_handler(), "cpu_deepseek_embed_head"]
