"""Fixed-shape attention kernels of the CPU graph emulation (``graph_attention.py``
installs them on ``torch_native``; ``draft_attention.py`` and ``ragged_attention.py`` use
them too).

Each reads lengths, KV slots and tree masks from tensors and gathers K/V rows through
``req_to_token`` over a fixed width (the pool's maximum context length), masking what a
request does not own: shapes depend on batch size, draft width and pool width only, never
on the lengths, so a captured graph replays them on new lengths correctly.

Sliding-window layers pass ``window`` (the host's ``sliding_window_size``; ``-1`` for
none): a query at position ``p`` sees the keys at positions ``p - window`` to ``p``, as
the host's ``torch_native`` loop slices them; a draft key's position is its query's.
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention


def gather_rows(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``cache[slots]`` (rows of a KV buffer, any shape of ``slots``) by ``index_select``:
    on a CPU several times faster than advanced indexing (measured: 6 against 34 us for 400
    rows of 3 x 64), the gather every CPU attention here makes per request and layer."""
    flat = cache.index_select(0, slots.reshape(-1).long())
    return flat.view(*slots.shape, *cache.shape[1:])


def _gather_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V rows of ``slots`` ([B, W] KV slots) as [B, Hk, W, D(v)] in ``dtype``."""
    return (
        gather_rows(k_cache, slots).to(dtype).transpose(1, 2),
        gather_rows(v_cache, slots).to(dtype).transpose(1, 2),
    )


def masked_table_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    lengths: torch.Tensor,
    scaling: float | None,
    enable_gqa: bool,
    window: int = -1,
) -> torch.Tensor:
    """One query token per row over the first ``lengths[i]`` KV slots of ``table[i]``
    (the query at position ``lengths[i] - 1``).

    ``query`` [N, Hq, D]; ``k_cache``/``v_cache`` [P, Hk, D(v)]; ``table`` [N, W] (KV
    slots); returns [N, Hq, Dv]. Shapes depend on N and W only (graph-safe).
    """
    width = table.shape[1]
    keys, values = _gather_kv(k_cache, v_cache, table, query.dtype)  # [N, Hk, W, D(v)]
    positions = torch.arange(width, device=query.device)
    ends = lengths.unsqueeze(1).to(positions.dtype)
    valid = positions.unsqueeze(0) < ends  # [N, W]
    if window > -1:
        valid &= positions.unsqueeze(0) >= ends - 1 - window
    out = scaled_dot_product_attention(
        query.unsqueeze(2),  # [N, Hq, 1, D]
        keys,
        values,
        attn_mask=valid[:, None, None, :],
        scale=scaling,
        enable_gqa=enable_gqa,
    )
    return out.squeeze(2)


def masked_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scaling: float | None,
    enable_gqa: bool,
    window: int = -1,
) -> torch.Tensor:
    """One query token per request over its first ``seq_lens[i]`` KV rows.

    ``query`` [B, Hq, D]; ``k_cache``/``v_cache`` [P, Hk, D(v)]; ``req_to_token`` [R, L];
    returns [B, Hq, Dv]. Shapes depend on B and L only (graph-safe).
    """
    rows = req_to_token.index_select(0, req_pool_indices.long())  # [B, L]
    return masked_table_attention(
        query, k_cache, v_cache, rows, seq_lens, scaling, enable_gqa, window
    )


def _requests_sdpa(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scaling: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """SDPA of ``n`` query tokens per request: ``query`` [B * n, Hq, D], ``keys`` /
    ``values`` [B, Hk, K, D(v)], ``mask`` [B, n, K] bool; returns [B * n, Hq, Dv]."""
    bs, n = mask.shape[0], mask.shape[1]
    heads, dim = query.shape[1], query.shape[2]
    out = scaled_dot_product_attention(
        query.view(bs, n, heads, dim).transpose(1, 2),  # [B, Hq, n, D]
        keys,
        values,
        attn_mask=mask.unsqueeze(1),
        scale=scaling,
        enable_gqa=enable_gqa,
    )
    return out.transpose(1, 2).reshape(bs * n, heads, -1)


def masked_extend_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scaling: float | None,
    enable_gqa: bool,
    window: int = -1,
) -> torch.Tensor:
    """A causal extend of the same ``n`` tokens per request (a model draft's draft extend):
    ``seq_lens`` counts them, so query ``j`` of request ``i`` reads its first
    ``seq_lens[i] - n + j + 1`` KV rows (at least one: padded requests stay finite).

    ``query`` [B * n, Hq, D]; returns [B * n, Hq, Dv]. Shapes depend on B, n and the pool
    width only (graph-safe).
    """
    bs = req_pool_indices.shape[0]
    n = query.shape[0] // bs
    width = req_to_token.shape[1]
    rows = req_to_token.index_select(0, req_pool_indices.long())  # [B, L]
    keys, values = _gather_kv(k_cache, v_cache, rows, query.dtype)  # [B, Hk, L, D(v)]
    step = torch.arange(n, device=query.device)
    limit = (seq_lens.reshape(-1, 1).to(step.dtype) - n + step.unsqueeze(0) + 1).clamp(min=1)
    positions = torch.arange(width, device=query.device)
    mask = positions.view(1, 1, width) < limit.unsqueeze(2)  # [B, n, L]
    if window > -1:  # query j sits at position limit - 1
        mask &= positions.view(1, 1, width) >= (limit - 1 - window).unsqueeze(2)
    return _requests_sdpa(query, keys, values, mask, scaling, enable_gqa)


def masked_verify_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    draft_slots: torch.Tensor,
    visible: torch.Tensor,
    scaling: float | None,
    enable_gqa: bool,
    window: int = -1,
    query_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """``n`` draft tokens per request over its first ``seq_lens[i]`` committed KV rows
    plus the drafts ``visible[i]`` marks (``[B, n, n]`` bool, row = query).

    ``query`` [B * n, Hq, D]; ``draft_slots`` [B, n] (the drafts' KV slots); returns
    [B * n, Hq, Dv]. Shapes depend on B, n and the pool width only (graph-safe). With a
    ``window``, ``query_positions`` [B * n] places each draft token (a tree node at
    ``seq_lens[i] + depth``); a draft key's position is its own query's.
    """
    bs, n = draft_slots.shape
    width = req_to_token.shape[1]
    rows = req_to_token.index_select(0, req_pool_indices.long()).long()  # [B, L]
    slots = torch.cat([rows, draft_slots.long()], dim=1)  # [B, L + n]
    keys, values = _gather_kv(k_cache, v_cache, slots, query.dtype)  # [B, Hk, L + n, D(v)]
    positions = torch.arange(width, device=query.device)
    prefix = positions.unsqueeze(0) < seq_lens.unsqueeze(1).to(positions.dtype)  # [B, L]
    prefix = prefix.unsqueeze(1).expand(bs, n, width)
    if window > -1:
        if query_positions is None:
            raise ValueError("masked_verify_attention: a window needs query_positions")
        first = query_positions.reshape(bs, n).to(positions.dtype) - window  # [B, n]
        prefix = prefix & (positions.view(1, 1, width) >= first.unsqueeze(2))
        draft_pos = query_positions.reshape(bs, 1, n).to(positions.dtype)
        visible = visible & (draft_pos >= first.unsqueeze(2))
    mask = torch.cat([prefix, visible], dim=2)
    return _requests_sdpa(query, keys, values, mask, scaling, enable_gqa)


def stage_verify_mask(buffer: torch.Tensor, custom_mask: torch.Tensor | None) -> None:
    """Copy a verify input's tree mask (the per-request ``n x n`` layout the CPU engine
    builds, QLEN_ONLY) into the static ``[max_bs, n, n]`` buffer; rows past the batch
    (padding) get a causal mask. Raises on a mask in another layout."""
    max_bs, n, _ = buffer.shape
    causal = torch.ones(n, n, dtype=torch.bool, device=buffer.device).tril()
    rows = 0
    if custom_mask is not None and custom_mask.numel() > 0:
        if custom_mask.numel() % (n * n):
            raise ValueError(
                f"CPU graphs: verify mask of {custom_mask.numel()} entries is not the "
                f"per-request {n}x{n} layout; run this server without "
                "SGLANG_SPEC_EXT_CPU_GRAPHS"
            )
        rows = min(custom_mask.numel() // (n * n), max_bs)
        eye = torch.eye(n, dtype=torch.bool, device=buffer.device)
        flat = custom_mask.reshape(-1)[: rows * n * n] != 0
        buffer[:rows].copy_(flat.view(rows, n, n) | eye)
    buffer[rows:].copy_(causal.expand(max_bs - rows, n, n))
