"""Graph-safe ragged tree verify for the CPU engine's ``torch_native`` backend.

Under the token-bucket verify graphs (``sglang/verify/ragged_graphs.py``, the host's
compact ragged mode) a verify forward holds ``T`` packed tokens (the bucket): request
slot ``b`` owns ``verify_lens[b]`` of them from ``qo_indptr[b]`` (the runner's padding
slots own the bucket's leftover, at most the width each); tokens past the last slot's
belong to none. The lengths and offsets live in the captured layout's tensors, which
the host's runner refreshes in place before every replay, so everything here is tensor
work on them (graph-safe; shapes depend on ``T``, the slot count and the width only):

* each slot's rows are gathered into a padded ``[slots, n]`` query block (``n`` the
  width the graph was captured at), its draft KV slots likewise;
* :func:`~.masked_attention.masked_verify_attention` attends them over the slot's
  committed prefix and the drafts its tree mask row marks, keys past the slot's length
  masked out;
* the rows are scattered back to the packed order (tokens of no slot get zeros).

The tree masks come from a static ``[max_bs, n, n]`` buffer staged outside the graph
(:func:`stage_ragged_mask`): the live verify input's per-request masks (at the live
width, at most ``n``: a SUFFIX step verified at its longest draft) in the top-left
corner of each slot's block.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_spec_ext.sglang.cpu.masked_attention import masked_verify_attention


def masked_ragged_verify_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    cache_loc: torch.Tensor,
    verify_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    visible: torch.Tensor,
    scaling: float | None,
    enable_gqa: bool,
    window: int = -1,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ragged verify of ``T`` packed tokens (see the module doc).

    ``query`` [T, Hq, D]; ``cache_loc`` [T] (their KV slots); ``verify_lens`` [B],
    ``qo_indptr`` [B + 1] (slot ``b``'s first token); ``visible`` [B, n, n] bool (row =
    query); ``positions`` [T] (the tokens' positions, needed with a sliding ``window``).
    Returns [T, Hq, Dv], zero for tokens of no slot.
    """
    total = query.shape[0]
    bs, n = visible.shape[0], visible.shape[1]
    step = torch.arange(n, device=query.device)
    rows = qo_indptr[:bs].to(torch.int64).unsqueeze(1) + step  # [B, n] packed index
    valid = step.unsqueeze(0) < verify_lens[:bs].to(torch.int64).unsqueeze(1)  # [B, n]
    gather = torch.where(valid, rows, torch.zeros_like(rows)).clamp(max=total - 1).view(-1)
    keys_ok = visible & valid.unsqueeze(1)  # a key past the slot's length is no draft
    out = masked_verify_attention(
        query.index_select(0, gather),
        k_cache,
        v_cache,
        req_to_token,
        req_pool_indices,
        seq_lens,
        cache_loc.index_select(0, gather).view(bs, n),
        keys_ok,
        scaling,
        enable_gqa,
        window,
        None if positions is None else positions.index_select(0, gather),
    )  # [B * n, Hq, Dv]
    packed = out.new_zeros((total + 1, *out.shape[1:]))
    scatter = torch.where(valid, rows, torch.full_like(rows, total)).view(-1)
    packed.index_copy_(0, scatter, out)  # rows of no token land on the extra row
    return packed[:total]


def stage_ragged_mask(buffer: torch.Tensor, custom_mask: torch.Tensor | None, n: int) -> None:
    """Copy a verify input's per-request ``n x n`` tree masks (QLEN_ONLY) into the
    top-left corner of each slot's block of the static ``[max_bs, N, N]`` buffer
    (``n <= N``); the rest of a block, and slots past the batch, get a causal mask."""
    max_bs, width, _ = buffer.shape
    if n > width:
        raise ValueError(f"CPU graphs: verify width {n} exceeds the captured width {width}")
    buffer.copy_(torch.ones(width, width, dtype=torch.bool, device=buffer.device).tril())
    if custom_mask is None or custom_mask.numel() == 0:
        return
    if custom_mask.numel() % (n * n):
        raise ValueError(
            f"CPU graphs: verify mask of {custom_mask.numel()} entries is not the "
            f"per-request {n}x{n} layout; run this server without SGLANG_SPEC_EXT_CPU_GRAPHS"
        )
    rows = min(custom_mask.numel() // (n * n), max_bs)
    eye = torch.eye(n, dtype=torch.bool, device=buffer.device)
    flat = custom_mask.reshape(-1)[: rows * n * n] != 0
    buffer[:rows, :n, :n].copy_(flat.view(rows, n, n) | eye)


def stage_ragged(backend: Any, spec_info: Any, n: int, max_bs: int, in_capture: bool) -> None:
    """A token-bucket verify (``cpu/ragged_attention.py``): the backend's one ragged mask
    buffer, made at the first capture at that capture's width; a replay stages the live
    masks (at the live width, at most the captured one) into it."""
    buffer = getattr(backend, "_graph_ragged_mask", None)
    if buffer is None or (in_capture and buffer.shape[1] != n):
        if buffer is not None:
            raise ValueError(
                f"CPU graphs: one attention backend captured token-bucket verify graphs at "
                f"widths {buffer.shape[1]} and {n}; set SGLANG_SPEC_EXT_RAGGED_GRAPHS=0"
            )
        buffer = backend._graph_ragged_mask = torch.ones(max_bs, n, n, dtype=torch.bool).tril()
    stage_ragged_mask(buffer, None if in_capture else getattr(spec_info, "custom_mask", None), n)
