"""Graph-safe decode attention for the CPU engine's ``torch_native`` backend.

The host's ``TorchNativeAttnBackend.forward_decode`` loops over the requests in Python
and slices each request's KV rows by its length (``req_to_token[idx, :seq_len]``). Under
a captured graph (``SGLANG_SPEC_EXT_CPU_GRAPHS=1``, sglang/cpu/graphs.py) that loop and
those lengths are burned in at capture: a replay would attend over the capture-time
lengths, which is wrong. A CUDA-graph-capable backend instead reads lengths from device
buffers with fixed-shape tensor ops; this module does the same on CPU:

* the K/V rows of every request are gathered through ``req_to_token`` over a fixed
  width (the pool's maximum context length), so the shapes depend only on the batch
  size, never on the lengths;
* positions at or beyond each request's ``seq_lens`` entry are masked out, so padded
  requests (``seq_lens`` = the fill value, pool index 0) cost work but change nothing.

It is installed with the graph emulation and used for decode both eagerly and in
graphs, so the eager fallback (``can_run_graph`` false) and a replay compute the same
thing. Cross-attention, encoder lengths and sliding windows keep the host's loop (not
graph-safe; the emulation's capture refuses none of them, so keep such models eager).

Target verify (speculative decoding) works the same way, the way a GPU backend
(triton, flashinfer) handles it: outside the captured region
(``init_forward_metadata_out_graph``, run before capture and before every replay) the
step's tree mask is copied from the verify input into a static ``[max_bs, n, n]`` buffer;
inside, :func:`masked_verify_attention` reads that buffer, the request lengths and the
draft slots from static buffers only. Forwards not being captured (the eager path and
the warm-ups) keep the plugin's CPU fallback (``cpu_fallbacks/verify_attention.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang_spec_ext.sglang.cpu.graph_capture import is_capturing

#: Padded requests get this length (>= 1, so a masked row never attends to nothing).
SEQ_LEN_FILL_VALUE = 1

BACKEND_CLS = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"


def _gather_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V rows of ``slots`` ([B, W] KV slots) as [B, Hk, W, D(v)] in ``dtype``."""
    slots = slots.long()
    return (
        k_cache[slots].to(dtype).transpose(1, 2),
        v_cache[slots].to(dtype).transpose(1, 2),
    )


def masked_table_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    lengths: torch.Tensor,
    scaling: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """One query token per row over the first ``lengths[i]`` KV slots of ``table[i]``.

    ``query`` [N, Hq, D]; ``k_cache``/``v_cache`` [P, Hk, D(v)]; ``table`` [N, W] (KV
    slots); returns [N, Hq, Dv]. Shapes depend on N and W only (graph-safe).
    """
    width = table.shape[1]
    keys, values = _gather_kv(k_cache, v_cache, table, query.dtype)  # [N, Hk, W, D(v)]
    positions = torch.arange(width, device=query.device)
    valid = positions.unsqueeze(0) < lengths.unsqueeze(1).to(positions.dtype)  # [N, W]
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
) -> torch.Tensor:
    """One query token per request over its first ``seq_lens[i]`` KV rows.

    ``query`` [B, Hq, D]; ``k_cache``/``v_cache`` [P, Hk, D(v)]; ``req_to_token`` [R, L];
    returns [B, Hq, Dv]. Shapes depend on B and L only (graph-safe).
    """
    rows = req_to_token.index_select(0, req_pool_indices.long())  # [B, L]
    return masked_table_attention(query, k_cache, v_cache, rows, seq_lens, scaling, enable_gqa)


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
) -> torch.Tensor:
    """``n`` draft tokens per request over its first ``seq_lens[i]`` committed KV rows
    plus the drafts ``visible[i]`` marks (``[B, n, n]`` bool, row = query).

    ``query`` [B * n, Hq, D]; ``draft_slots`` [B, n] (the drafts' KV slots); returns
    [B * n, Hq, Dv]. Shapes depend on B, n and the pool width only (graph-safe).
    """
    bs, n = draft_slots.shape
    width = req_to_token.shape[1]
    rows = req_to_token.index_select(0, req_pool_indices.long()).long()  # [B, L]
    slots = torch.cat([rows, draft_slots.long()], dim=1)  # [B, L + n]
    keys, values = _gather_kv(k_cache, v_cache, slots, query.dtype)  # [B, Hk, L + n, D(v)]
    positions = torch.arange(width, device=query.device)
    prefix = positions.unsqueeze(0) < seq_lens.unsqueeze(1).to(positions.dtype)  # [B, L]
    mask = torch.cat([prefix.unsqueeze(1).expand(bs, n, width), visible], dim=2)
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


def init_forward_metadata_out_graph_hook(
    original: Callable[..., Any], self: Any, forward_batch: Any, *a: Any, **kw: Any
) -> Any:
    """AROUND ``init_forward_metadata_out_graph`` (the graph runners' out-of-graph prep,
    at capture and before every replay): stage the verify tree mask into the static
    buffer."""
    result = original(self, forward_batch, *a, **kw)
    if not forward_batch.forward_mode.is_target_verify():
        return result
    max_bs = getattr(self, "_graph_max_bs", None)
    spec_info = forward_batch.spec_info
    if max_bs is None or spec_info is None:
        return result
    n = int(spec_info.draft_token_num)
    in_capture = bool(kw.get("in_capture", a[0] if a else False))
    if getattr(spec_info, "ragged_verify_layout", None) is not None:
        from sglang_spec_ext.sglang.cpu.ragged_attention import stage_ragged

        stage_ragged(self, spec_info, n, max_bs, in_capture)
        return result
    masks = self.__dict__.setdefault("_graph_verify_masks", {})
    if n not in masks:
        masks[n] = torch.ones(max_bs, n, n, dtype=torch.bool).tril()
    # At capture the verify input is the runner's placeholder (values are not used).
    stage_verify_mask(masks[n], None if in_capture else getattr(spec_info, "custom_mask", None))
    return result


def forward_hook(
    original: Callable[..., torch.Tensor],
    self: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer: Any,
    forward_batch: Any,
    save_kv_cache: bool = True,
    **kwargs: Any,
) -> torch.Tensor:
    """AROUND ``TorchNativeAttnBackend.forward``: a verify forward being captured into a
    graph takes the graph-safe verify (recorded, so every replay runs it); a model draft's
    draft extend (``DRAFT_EXTEND_V2``) takes the graph-safe masked extend, eagerly and in
    graphs alike (its capture batch has no prefix lengths for the host's loop); everything
    else (eager verify, the warm-ups before capture) goes where the host sends it."""
    mode = forward_batch.forward_mode
    if (
        kwargs
        or not (mode.is_draft_extend_v2() or (mode.is_target_verify() and is_capturing()))
        or not _graph_safe(layer, forward_batch)
        or self.use_sliding_window_kv_pool
    ):
        return original(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if save_kv_cache and k is not None and v is not None:
        self.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v
        )
    heads = layer.tp_q_head_num
    bs = forward_batch.req_pool_indices.shape[0]
    if mode.is_draft_extend_v2():
        out = masked_extend_attention(
            q.reshape(-1, heads, layer.qk_head_dim),
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            self.req_to_token_pool.req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens[:bs],
            layer.scaling,
            heads != layer.tp_k_head_num,
        )
        return out.reshape(-1, heads * layer.v_head_dim)
    layout = getattr(forward_batch.spec_info, "ragged_verify_layout", None)
    if layout is not None:
        from sglang_spec_ext.sglang.cpu.ragged_attention import masked_ragged_verify_attention

        out = masked_ragged_verify_attention(
            q.reshape(-1, heads, layer.qk_head_dim),
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            self.req_to_token_pool.req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens[:bs],
            forward_batch.out_cache_loc,
            layout.verify_lens,
            layout.qo_indptr_device,
            self._graph_ragged_mask[:bs],
            layer.scaling,
            heads != layer.tp_k_head_num,
        )
        return out.reshape(-1, heads * layer.v_head_dim)
    n = int(forward_batch.spec_info.draft_token_num)
    out = masked_verify_attention(
        q.reshape(-1, heads, layer.qk_head_dim),
        self.token_to_kv_pool.get_key_buffer(layer.layer_id),
        self.token_to_kv_pool.get_value_buffer(layer.layer_id),
        self.req_to_token_pool.req_to_token,
        forward_batch.req_pool_indices,
        forward_batch.seq_lens[:bs],
        forward_batch.out_cache_loc[: bs * n].view(bs, n),
        self._graph_verify_masks[n][:bs],
        layer.scaling,
        heads != layer.tp_k_head_num,
    )
    return out.reshape(-1, heads * layer.v_head_dim)


def _graph_safe(layer: Any, forward_batch: Any) -> bool:
    window = getattr(layer, "sliding_window_size", None)
    return (
        not getattr(layer, "is_cross_attention", False)
        and getattr(forward_batch, "encoder_lens", None) is None
        and (window is None or window <= -1)
    )


def forward_decode_hook(
    original: Callable[..., torch.Tensor],
    self: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer: Any,
    forward_batch: Any,
    save_kv_cache: bool = True,
    **kwargs: Any,
) -> torch.Tensor:
    """AROUND ``TorchNativeAttnBackend.forward_decode``: masked dense decode attention
    where it is graph-safe, the host's per-request loop otherwise."""
    if kwargs or not _graph_safe(layer, forward_batch) or self.use_sliding_window_kv_pool:
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
    if save_kv_cache and k is not None and v is not None:
        self.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v
        )
    out = masked_decode_attention(
        q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
        self.token_to_kv_pool.get_key_buffer(layer.layer_id),
        self.token_to_kv_pool.get_value_buffer(layer.layer_id),
        self.req_to_token_pool.req_to_token,
        forward_batch.req_pool_indices,
        forward_batch.seq_lens,
        layer.scaling,
        layer.tp_q_head_num != layer.tp_k_head_num,
    )
    return out.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)


def init_cuda_graph_state(self: Any, max_bs: int, max_num_tokens: int) -> None:
    """Record the largest captured batch; the verify tree-mask buffers are made per
    verify width at the first out-of-graph prep (decode needs none)."""
    self._graph_max_bs = max_bs
    self._graph_verify_masks = {}
    self._graph_ragged_mask = None
    # Token-bucket verify graphs (verify/ragged_graphs.py) may replay on this backend:
    # masked_ragged_verify_attention (cpu/ragged_attention.py) reads their layout.
    self.supports_ragged_verify_graph = True


def get_cuda_graph_seq_len_fill_value(self: Any) -> int:
    """Length given to padded requests in a captured batch."""
    return SEQ_LEN_FILL_VALUE


def attention_hooks() -> list[tuple[str, Any, Any]]:
    """``(target, hook, HookType)`` for :func:`runtime_hooks.register_hooks_once`."""
    from sglang.srt.plugins.hook_registry import HookType

    return [
        (BACKEND_CLS + ".forward", forward_hook, HookType.AROUND),
        (
            BACKEND_CLS + ".init_forward_metadata_out_graph",
            init_forward_metadata_out_graph_hook,
            HookType.AROUND,
        ),
        (BACKEND_CLS + ".forward_decode", forward_decode_hook, HookType.AROUND),
        (BACKEND_CLS + ".init_cuda_graph_state", init_cuda_graph_state, HookType.REPLACE),
        (
            BACKEND_CLS + ".get_cuda_graph_seq_len_fill_value",
            get_cuda_graph_seq_len_fill_value,
            HookType.REPLACE,
        ),
    ]
