"""MLA models (DeepSeek-V3 and kin) on the CPU engine's ``torch_native`` attention.

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
``torch_native`` runs exactly that. :func:`install_mla_cpu` registers a
``torch_native`` handler choosing it for every forward (the host's own subtype
dispatch, so an AMX CPU keeps its fused-rope method).

Installed only on the CPU engine. (The NextN draft's shared embedding and head:
``mtp_heads.py``.)
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


def install_mla_cpu() -> list[str]:
    """Register :func:`handle_attention_torch_native` with the host's registry (where the
    host has none of its own for ``torch_native``)."""
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
