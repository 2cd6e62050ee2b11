"""Ragged chain verify on the CPU engine, read the way the host's FA3 backend reads it.

The host's FA3 (and trtllm_mha) target verify at ``topk <= 1`` takes a ragged verify from
the verify input's ``RaggedVerifyLayout``: ``build_ragged_target_verify_geometry`` turns
it into varlen geometry (``cu_seqlens_q`` from the lengths, ``cache_seqlens = seq_lens +
L_i``), the page table is ``req_to_token[req_pool_indices, :max_k]``, and the kernel
attends causally, the queries aligned to the end of each request's keys
(``flash_attn_with_kvcache(..., causal=True)``): query ``i`` of a request with ``L``
queries and ``K`` keys sees keys ``0 .. K - L + i``. That is right for chain drafts only.

:func:`host_layout_verify_attention` is that contract in torch, for ``torch_native``'s
verify hook (``fallbacks/verify_attention.py``) when the drafts are chains and the verify
input carries the host's layout (``verify/ragged_backends.py``, the host-layout route): the
geometry comes from the host's own builder, so what a CPU test shows of the layout SUFFIX
and HYBRID hand over (compact rows in request order, positions, KV slots) is what FA3
would read. The FA3 kernel itself needs a GPU; this is its semantics, not its code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang_spec_ext.sglang.cpu.masked_attention import gather_rows


def varlen_causal_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    scaling: float | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """FA-style varlen causal attention over a paged KV cache.

    ``q``: ``[rows, heads, dim]`` (rows past ``cu_seqlens_q[-1]``, a token bucket's
    padding, come back zero); ``k_cache``/``v_cache``: ``[slots, kv_heads, dim]``;
    ``page_table[b, j]``: the KV slot of request ``b``'s key ``j``; ``cache_seqlens[b]``:
    its keys (committed plus verified); ``cu_seqlens_q``: ``[bs + 1]`` query offsets.
    With ``sliding_window`` a query at position ``p`` sees keys from ``p - window`` on.
    Returns ``[rows, heads, v_dim]``.
    """
    heads = q.shape[1]
    out = q.new_zeros((q.shape[0], heads, v_cache.shape[-1]))
    offsets = cu_seqlens_q.tolist()
    key_lens = cache_seqlens.tolist()
    gqa = heads != k_cache.shape[1]
    for b, k_len in enumerate(key_lens):
        lo, hi = offsets[b], offsets[b + 1]
        n = hi - lo
        if n <= 0:
            continue
        if n > k_len:
            raise ValueError(f"request {b}: {n} queries over {k_len} keys")
        slots = page_table[b, :k_len].to(torch.int64)
        keys = gather_rows(k_cache, slots).to(q.dtype).movedim(0, 1)  # [kv_heads, K, dim]
        values = gather_rows(v_cache, slots).to(q.dtype).movedim(0, 1)
        qpos = torch.arange(k_len - n, k_len, device=q.device)[:, None]
        kpos = torch.arange(k_len, device=q.device)[None, :]
        mask = kpos <= qpos
        if sliding_window is not None and sliding_window > -1:
            mask &= kpos >= qpos - sliding_window
        result = scaled_dot_product_attention(
            q[lo:hi].movedim(0, 1).unsqueeze(0),
            keys.unsqueeze(0),
            values.unsqueeze(0),
            attn_mask=mask,
            scale=scaling,
            enable_gqa=gqa,
        )
        out[lo:hi] = result.squeeze(0).movedim(0, 1)
    return out


def host_layout_verify_attention(
    backend: Any, q: torch.Tensor, layer: Any, forward_batch: Any, layout: Any
) -> torch.Tensor:
    """``torch_native``'s target verify of a chain draft whose verify input carries the
    host's ``RaggedVerifyLayout``: geometry and page table as FA3 builds them, then
    :func:`varlen_causal_attention`. The KV of the verified tokens is already written."""
    from sglang.srt.speculative.ragged_verify import build_ragged_target_verify_geometry

    seq_lens = forward_batch.seq_lens.reshape(-1)
    geometry = build_ragged_target_verify_geometry(seq_lens=seq_lens, layout=layout)
    max_k = int(geometry.cache_seqlens_int32.max()) if seq_lens.numel() else 0
    table = backend.req_to_token_pool.req_to_token
    page_table = table[forward_batch.req_pool_indices.to(torch.int64), :max_k]
    heads, qk_dim, v_dim = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
    window = layer.sliding_window_size
    out = varlen_causal_attention(
        q.reshape(-1, heads, qk_dim),
        backend.token_to_kv_pool.get_key_buffer(layer.layer_id),
        backend.token_to_kv_pool.get_value_buffer(layer.layer_id),
        page_table,
        geometry.cache_seqlens_int32,
        geometry.cu_seqlens_q,
        scaling=layer.scaling,
        sliding_window=window if window is not None and window > -1 else None,
    )
    return out.reshape(-1, heads * v_dim)
