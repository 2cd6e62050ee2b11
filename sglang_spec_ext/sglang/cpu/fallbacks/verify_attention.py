"""Target-verify (tree) attention for the host's ``torch_native`` attention backend.

SGLang 0.5.23's ``TorchNativeAttnBackend`` implements extend and decode only: a
TARGET_VERIFY batch reaches ``forward_extend`` without ``extend_*`` fields and fails.
The CPU engine's spec-capable backend (``intel_amx``) needs sgl-kernel's attention
ops, so on a CPU-only host nothing can verify a draft. :func:`forward_extend_hook`
(an AROUND hook on ``TorchNativeAttnBackend.forward_extend``) handles verify batches
with :func:`tree_verify_attention` and passes everything else to the original.

A chain draft whose verify input carries the host's ``RaggedVerifyLayout`` (the
host-layout route, ``verify/ragged_backends.py``) is read as the host's FA3 backend reads
it (``cpu/causal_ragged_attention.py``). Otherwise, semantics (as the host's ``intel_amx``
backend): each request verifies
``draft_token_num`` tokens (under ragged verify its own count, ``ragged_lens_cpu``)
stored after its ``seq_len`` committed ones; every draft
token sees the whole committed prefix and, among the drafts, itself and the ancestors
its row of ``spec_info.custom_mask`` marks (plain causal order for chains,
``tree_topk == 1``, or when no mask is given).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang_spec_ext.sglang.cpu.masked_attention import gather_rows


def draft_masks(
    custom_mask: torch.Tensor | None, seq_lens: torch.Tensor, n: int, chain: bool
) -> torch.Tensor:
    """``[bs, n, n]`` bool visibility among each request's drafts (diagonal included).

    ``custom_mask`` may be the per-request ``n x n`` layout (QLEN_ONLY, what NGRAM
    builds on CPU) or the FULL_MASK layout (rows of ``seq_len + n`` per draft token).
    """
    bs = seq_lens.numel()
    eye = torch.eye(n, dtype=torch.bool, device=seq_lens.device)
    if chain or custom_mask is None or custom_mask.numel() == 0:
        return torch.ones(n, n, dtype=torch.bool, device=seq_lens.device).tril().expand(bs, n, n)
    flat = custom_mask.reshape(-1) != 0
    if flat.numel() >= bs * n * n and flat.numel() < _full_mask_numel(seq_lens, n):
        return flat[: bs * n * n].view(bs, n, n) | eye
    masks = []
    start = 0
    for seq_len in seq_lens.tolist():
        width = seq_len + n
        rows = flat[start : start + n * width].view(n, width)
        masks.append(rows[:, seq_len:] | eye)
        start += n * width
    return torch.stack(masks) if masks else eye.expand(0, n, n)


def _full_mask_numel(seq_lens: torch.Tensor, n: int) -> int:
    return int((seq_lens.to(torch.int64) + n).sum()) * n


def tree_verify_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_slots: list[torch.Tensor],
    draft_slots: torch.Tensor,
    visible: torch.Tensor,
    *,
    scaling: float | None = None,
    query_positions: torch.Tensor | None = None,
    sliding_window: int | None = None,
    lens: list[int] | None = None,
) -> torch.Tensor:
    """Attention of every request's draft tokens over its prefix plus drafts.

    ``q``: ``[bs * n, heads, head_dim]``; ``k_cache``/``v_cache``: ``[slots, kv_heads,
    dim]``; ``prefix_slots[b]``: the KV slots of request ``b``'s committed tokens;
    ``draft_slots``: ``[bs, n]`` KV slots of the drafts; ``visible``: ``[bs, n, n]``.
    With ``sliding_window``, a key at position ``p`` (a prefix token, or a draft ancestor
    at its own position) is seen by a query at position ``qp`` only if
    ``p >= qp - sliding_window``. Returns ``[bs * n, heads,
    v_dim]``.

    Ragged verify (``lens``, ``sglang/verify/ragged.py``): request ``b`` verifies only its
    first ``lens[b]`` draft rows; ``q`` and ``draft_slots`` (flat, ``[sum lens]``) hold
    those rows in request order, ``visible`` stays ``[bs, n, n]`` (its top-left
    ``lens[b]`` square is used). Returns ``[sum lens, heads, v_dim]``; where ``q`` holds
    more rows (a token bucket's padding, ``verify/ragged_graphs.py``) those rows are zero.
    """
    if lens is None:
        bs, n = draft_slots.shape
        lens = [n] * bs
    else:
        bs = len(lens)
    draft_slots = draft_slots.reshape(-1)
    heads = q.shape[1]
    # Tokens past the requests' (a token bucket's padding) belong to none: zeros.
    make = q.new_zeros if sum(lens) < q.shape[0] else q.new_empty
    out = make((q.shape[0], heads, v_cache.shape[-1]))
    gqa = heads != k_cache.shape[1]
    start = 0
    for b in range(bs):
        n, lo = lens[b], start
        start += n
        slots = torch.cat(
            [prefix_slots[b].to(torch.int64), draft_slots[lo : lo + n].to(torch.int64)]
        )
        keys = gather_rows(k_cache, slots).to(q.dtype).movedim(0, 1)  # [kv_heads, L, dim]
        values = gather_rows(v_cache, slots).to(q.dtype).movedim(0, 1)
        prefix = prefix_slots[b].numel()
        mask = torch.ones((n, prefix + n), dtype=torch.bool, device=q.device)
        mask[:, prefix:] = visible[b, :n, :n]
        if sliding_window is not None and sliding_window > -1 and query_positions is not None:
            qpos = query_positions[lo : lo + n].to(torch.int64)
            kpos = torch.arange(prefix, device=q.device)[None, :]
            mask[:, :prefix] &= kpos >= qpos[:, None] - sliding_window
            # the draft keys too: a draft longer than the window leaves its own first
            # tokens behind (a draft token's position is its query's)
            mask[:, prefix:] &= qpos[None, :] >= qpos[:, None] - sliding_window
        query = q[lo : lo + n].movedim(0, 1)  # [heads, n, dim]
        result = scaled_dot_product_attention(
            query.unsqueeze(0),
            keys.unsqueeze(0),
            values.unsqueeze(0),
            attn_mask=mask,
            scale=scaling,
            enable_gqa=gqa,
        )
        out[lo : lo + n] = result.squeeze(0).movedim(0, 1)
    return out


def chain_drafts() -> bool:
    """Whether this server verifies chains (``--speculative-eagle-topk 1`` as resolved):
    what the host's FA3 backend keys its causal target verify on."""
    from sglang.srt.runtime_context import get_spec

    return int(get_spec().speculative_eagle_topk or 0) <= 1


def forward_extend_hook(
    original: Callable[..., torch.Tensor],
    backend: Any,
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    layer: Any,
    forward_batch: Any,
    save_kv_cache: bool = True,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """AROUND hook for ``TorchNativeAttnBackend.forward_extend``: verify batches here."""
    if not forward_batch.forward_mode.is_target_verify() or layer.is_cross_attention:
        return original(backend, q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    spec_info = forward_batch.spec_info
    n = int(spec_info.draft_token_num)
    lens = getattr(spec_info, "ragged_lens_cpu", None)  # ragged verify (verify/ragged.py)
    layout = getattr(spec_info, "ragged_verify_layout", None)  # token buckets (ragged_graphs)
    if lens is None and layout is not None:
        lens = layout.verify_lens_cpu  # a capture's warm-up: the capture layout's lengths
    cache_loc = forward_batch.out_cache_loc
    if save_kv_cache and k is not None and v is not None:
        backend.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(cache_loc, backend.swa_out_cache_loc), k, v
        )
    if lens is None and layout is not None and layout.verify_lens_cpu and chain_drafts():
        # Chains with the host's layout: read as the host's FA3 backend reads them.
        from sglang_spec_ext.sglang.cpu.causal_ragged_attention import (
            host_layout_verify_attention,
        )

        return host_layout_verify_attention(backend, q, layer, forward_batch, layout)
    seq_lens = forward_batch.seq_lens.reshape(-1)
    bs = seq_lens.numel()
    table = backend.req_to_token_pool.req_to_token
    prefix_slots = [
        table[int(r), : int(s)]
        for r, s in zip(forward_batch.req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
    ]
    visible = draft_masks(
        getattr(spec_info, "custom_mask", None),
        seq_lens,
        n,
        getattr(spec_info, "tree_topk", -1) == 1,
    )
    window = layer.sliding_window_size
    heads, qk_dim, v_dim = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
    out = tree_verify_attention(
        q.reshape(-1, heads, qk_dim),
        backend.token_to_kv_pool.get_key_buffer(layer.layer_id),
        backend.token_to_kv_pool.get_value_buffer(layer.layer_id),
        prefix_slots,
        cache_loc if lens is not None else cache_loc.reshape(bs, n),
        visible,
        scaling=layer.scaling,
        query_positions=forward_batch.positions,
        sliding_window=window if window is not None and window > -1 else None,
        lens=lens,
    )
    return out.reshape(-1, heads * v_dim)
