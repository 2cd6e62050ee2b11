"""DP attention (``--enable-dp-attention``) on the CPU engine's ``torch_native`` backend.

Under DP attention every rank pads its batch to the size the ranks agreed on for the
gathered MLP (``ForwardBatch.prepare_mlp_sync_batch`` -> ``_pad_inputs_to_size`` in
``srt/model_executor/forward_batch_info.py``). On the CPU engine that padding asks the
attention backend for the sequence length of a padded request through
``get_cpu_graph_seq_len_fill_value()``, which the host's CPU backend for AMX machines
(``intel_amx``) defines and ``torch_native`` (every CPU without AMX, this test bed)
does not: the first batch of a DP-attention server dies with an ``AttributeError``.

:func:`install_dp_attention_cpu` gives ``torch_native`` the method, answering what
``intel_amx`` answers (1: a padded request owns one KV slot, index 0, so it reads a
finite row and changes nothing). CPU engine only; nothing is replaced where the host
has the method.
"""

from __future__ import annotations

import importlib
from typing import Any

BACKEND_MODULE = "sglang.srt.layers.attention.torch_native_backend"
BACKEND_CLASS = "TorchNativeAttnBackend"
METHOD = "get_cpu_graph_seq_len_fill_value"


def get_cpu_graph_seq_len_fill_value(self: Any) -> int:
    """The sequence length of a padded request (as the host's ``intel_amx`` backend)."""
    return 1


def install_dp_attention_cpu() -> list[str]:
    """Give ``TorchNativeAttnBackend`` :func:`get_cpu_graph_seq_len_fill_value` where it
    lacks it; return what was installed."""
    try:
        cls = getattr(importlib.import_module(BACKEND_MODULE), BACKEND_CLASS)
    except (ImportError, AttributeError):
        return []
    if hasattr(cls, METHOD):
        return []
    setattr(cls, METHOD, get_cpu_graph_seq_len_fill_value)
    return ["cpu_dp_attention_padding"]
