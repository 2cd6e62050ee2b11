"""Pure-torch versions of the speculative-decoding host kernels of sgl-kernel's CPU build.

Each function has the exact call signature the host (sglang 0.5.23) uses for the
``*_cpu`` op it stands in for, and the same in-place semantics: it writes only the
elements the kernel writes and returns ``None``. Semantics follow the host's own
Triton/CUDA versions of each op (see the docstrings). Everything is vectorised over
the batch; the remaining Python loops run over KV buffers or tree levels, not tokens.

This module imports torch and the host's tree-mask layout writer (``verify/tree_mask.py``,
which HYBRID's verify rows use on every device).
"""

from __future__ import annotations

import ctypes

import torch

from sglang_spec_ext.sglang.verify.tree_mask import (  # noqa: F401 (modes re-exported)
    FULL_MASK,
    QLEN_ONLY,
    QLEN_ONLY_BITPACKING,
    flat_view,
    write_tree_mask,
)


def _rows(t: torch.Tensor, bs: int, n: int) -> torch.Tensor:
    """A writable ``[bs, n]`` view of the first ``bs * n`` elements of ``t``."""
    if t.dim() == 2:
        return t[:bs, :n]
    return t.view(-1)[: bs * n].view(bs, n)


def _ragged(start: torch.Tensor, end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For rows ``b`` covering ``[start[b], end[b])`` concatenated in batch order:
    (batch row, column) of every covered element. Negative spans count as empty."""
    start = start.reshape(-1).to(torch.int64)
    lens = (end.reshape(-1).to(torch.int64) - start).clamp_min(0)
    batch = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens)
    first = torch.cumsum(lens, 0) - lens
    within = torch.arange(batch.numel(), device=lens.device) - first[batch]
    return batch, start[batch] + within


# -- KV cache -----------------------------------------------------------------------------


def _byte_rows(address: int, stride: int, rows: int) -> torch.Tensor:
    """A zero-copy uint8 view of raw memory at ``address``, ``stride`` bytes a row, holding
    at least ``rows`` rows. Its row count is rounded up to a power of two: ctypes caches
    every array type it makes by length, for the life of the process, so one length per
    span would grow that cache step after step; rounded, a few dozen lengths at most.
    Rows past ``rows`` may lie outside the buffer and are never read or written."""
    span = 1 << max(rows - 1, 0).bit_length()
    buffer = (ctypes.c_uint8 * (span * stride)).from_address(address)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(span, stride)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every buffer ``i`` (base address ``data_ptrs[i]``, slot size ``strides[i]``
    bytes, slots contiguous): copy slot ``src_loc[k]`` to slot ``tgt_loc[k]`` for all
    ``k``. All sources are read before any target is written (safe when they overlap).
    """
    tgt = tgt_loc.reshape(-1).to(torch.int64)
    src = src_loc.reshape(-1).to(torch.int64)
    if tgt.numel() != src.numel():
        raise ValueError(f"tgt_loc has {tgt.numel()} slots but src_loc has {src.numel()}")
    if tgt.numel() == 0:
        return
    if int(torch.minimum(tgt.min(), src.min())) < 0:
        raise ValueError("copy_all_layer_kv_cache_cpu: negative KV slot index")
    span = int(torch.maximum(tgt.max(), src.max())) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        if address == 0 or stride <= 0:
            continue
        rows = _byte_rows(int(address), int(stride), span)
        rows[tgt] = rows[src]  # advanced indexing gathers a copy first


# -- cache locations ----------------------------------------------------------------------


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write the packed ``out_cache_loc`` (request ``b`` owns ``end[b] - start[b]``
    consecutive entries, in batch order) into
    ``req_to_token[req_pool_indices[b], start[b]:end[b]]``."""
    batch, cols = _ragged(start_offset, end_offset)
    reqs = req_pool_indices.reshape(-1).to(torch.int64)[batch]
    table = flat_view(req_to_token)
    table[reqs * pool_len + cols] = out_cache_loc.reshape(-1)[: batch.numel()].to(table.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The inverse gather: pack ``req_to_token[req_pool_indices[b], start[b]:end[b]]``
    for all ``b``, in batch order, into the front of ``out_cache_loc``."""
    batch, cols = _ragged(start_offset, end_offset)
    reqs = req_pool_indices.reshape(-1).to(torch.int64)[batch]
    out = flat_view(out_cache_loc)
    out[: batch.numel()] = req_to_token.reshape(-1)[reqs * pool_len + cols].to(out.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """``out_cache_loc[b * w + j] = req_to_token[req_pool_indices[b], seq_lens[b] + j]``
    for ``j < w = topk * num_steps``."""
    width = topk * num_steps
    bs = seq_lens.numel()
    if bs == 0 or width <= 0:
        return
    base = req_pool_indices.reshape(-1).to(torch.int64) * pool_len + seq_lens.reshape(-1).to(
        torch.int64
    )
    index = base[:, None] + torch.arange(width, device=base.device)
    out = flat_view(out_cache_loc)
    out[: bs * width] = req_to_token.reshape(-1)[index.reshape(-1)].to(out.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
    size: int | None = None,
) -> None:
    """Compact ``out_cache_loc[accept_index[p]]`` over the flattened ``accept_index``
    (first ``size`` entries, default all), skipping ``-1`` entries, into the front of
    ``accept_out_cache_loc``."""
    index = accept_index.reshape(-1).to(torch.int64)
    if size is not None:
        index = index[:size]
    counted = (index != -1).to(torch.int64)
    dst = torch.cumsum(counted, 0) - counted
    keep = index > -1
    out = flat_view(accept_out_cache_loc)
    out[dst[keep]] = out_cache_loc.reshape(-1)[index[keep]].to(out.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """``bonus_tokens[b] = accept_tokens.flat[accept_stride * b + accept_lens[b] - 1]``
    (the last accepted token of each request, bonus included)."""
    bs = accept_lens.numel()
    if bs == 0:
        return
    where = torch.arange(bs, device=accept_lens.device) * accept_stride
    where = where + accept_lens.reshape(-1).to(torch.int64) - 1
    out = flat_view(bonus_tokens)
    out[:bs] = accept_tokens.reshape(-1)[where].to(out.dtype)


# -- draft trees --------------------------------------------------------------------------


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM verify metadata from a per-request ``n x n`` ancestor mask (row ``i`` marks
    the ancestors of node ``i``; only ``j < i`` is read): depth + seq_len positions, the
    flat retrieve index, first child (``retrive_next_token``) and next sibling links."""
    bs, n = batch_size, draft_token_num
    if bs == 0:
        return
    mask = tree_mask.reshape(-1)[: bs * n * n].view(bs, n, n) != 0
    node = torch.arange(n, device=mask.device)
    ancestors = mask & (node[None, :] < node[:, None])  # [b, i, j]: j < i
    depth = ancestors.sum(-1)
    seq_len = verified_seq_len.reshape(-1)[:bs].to(torch.int64)
    flat_view(positions)[: bs * n] = (depth + seq_len[:, None]).reshape(-1).to(positions.dtype)
    flat_index = torch.arange(bs * n, device=mask.device).view(bs, n)
    _rows(retrive_index, bs, n).copy_(flat_index)
    parent = torch.where(ancestors, node, -1).amax(-1)  # [b, i]
    # first child of t: smallest k with ancestors[k, t] (so k > t)
    child = torch.where(ancestors, node[:, None], n).amin(1)  # [b, t]
    _rows(retrive_next_token, bs, n).copy_(torch.where(child < n, child, -1))
    same = (parent[:, :, None] == parent[:, None, :]) & (node[:, None] > node[None, :])
    sibling = torch.where(same, node[:, None], n).amin(1)  # [b, t]
    sibling = torch.where((parent >= 0) & (sibling < n), sibling, -1)
    _rows(retrive_next_sibling, bs, n).copy_(sibling)


def _eagle_parents(
    parent_list: torch.Tensor, selected_index: torch.Tensor, topk: int, depth: int, bs: int, n: int
) -> torch.Tensor:
    """Tree parent node of nodes ``1..n-1`` (``[bs, n-1]``): 0 for the root, the node
    whose selected index holds the parent token otherwise, -1 if none does."""
    selected = selected_index.reshape(-1)[: bs * (n - 1)].view(bs, n - 1).to(torch.int64)
    parent_block = selected // topk
    stride = topk * (depth - 1) + 1
    batch = torch.arange(bs, device=selected.device)[:, None]
    flat_parents = parent_list.reshape(-1).to(torch.int64)
    if flat_parents.numel() == 0:  # one draft step: every node hangs off the root
        flat_parents = torch.zeros(1, dtype=torch.int64, device=selected.device)
    safe = torch.where(parent_block > 0, batch * stride + parent_block, 0)
    parent_token = flat_parents[safe]
    hit = selected[:, None, :] == parent_token[:, :, None]  # [b, node-1, position]
    found = hit.any(-1)
    first = hit.to(torch.int8).argmax(-1)
    return torch.where(parent_block == 0, 0, torch.where(found, first + 1, -1))


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """EAGLE tree from top-k selection: node ``i >= 1`` is ``selected_index[b, i-1]``;
    its parent token is ``parent_list[b, selected // topk]`` (the root when that block is
    0). Writes each node's tree-mask row (root column and its ancestor path; the context
    prefix of FULL_MASK rows is left to the caller), positions, retrieve index and
    first-child / next-sibling links (children linked in ascending order)."""
    bs, n = verified_seq_len.numel(), draft_token_num
    if bs == 0:
        return
    device = verified_seq_len.device
    node = torch.arange(n, device=device)
    parent = torch.zeros((bs, n), dtype=torch.int64, device=device)
    if n > 1:
        parent[:, 1:] = _eagle_parents(parent_list, selected_index, topk, depth, bs, n)
    parent[:, 0] = -1
    batch = torch.arange(bs, device=device)[:, None]

    # Ancestor path of every node, root excluded; stops at the root or a missing parent.
    rows = torch.zeros((bs, n, n), dtype=torch.bool, device=device)
    rows[:, :, 0] = True
    hops = torch.zeros((bs, n), dtype=torch.int64, device=device)
    cur = node.expand(bs, n).clone()
    for _ in range(n):
        walking = cur > 0
        if not bool(walking.any()):
            break
        bi, ni = walking.nonzero(as_tuple=True)
        rows[bi, ni, cur[bi, ni]] = True
        hops += walking
        cur = torch.where(walking, parent.gather(1, cur.clamp_min(0)), 0).clamp_min(0)

    seq_len = verified_seq_len.reshape(-1).to(torch.int64)
    flat_view(positions)[: bs * n] = (hops + seq_len[:, None]).reshape(-1).to(positions.dtype)
    write_tree_mask(tree_mask, rows, seq_len, tree_mask_mode)
    _rows(retrive_index, bs, n).copy_(batch * n + node)

    # Links: children of p in ascending order; the largest child inherits any link
    # p already had (the kernel prepends each child to p's list).
    next_token = _rows(retrive_next_token, bs, n)
    next_sibling = _rows(retrive_next_sibling, bs, n)
    is_child = (parent[:, None, :] == node[None, :, None]) & (node > 0)  # [b, p, i]
    first_child = torch.where(is_child, node, n).amin(-1)  # [b, p]
    later = (parent[:, :, None] == parent[:, None, :]) & (node[None, :] > node[:, None])
    later &= (parent >= 0)[:, :, None]  # [b, i, k]: k > i shares i's (valid) parent
    sibling = torch.where(later, node, n).amin(-1)  # [b, i]
    inherited = next_token.gather(1, parent.clamp_min(0)).clone()
    new_sibling = torch.where(sibling < n, sibling, inherited)
    write_sibling = (parent >= 0) & (node > 0) & ((sibling < n) | (inherited != -1))
    next_sibling.copy_(torch.where(write_sibling, new_sibling, next_sibling))
    next_token.copy_(torch.where(first_child < n, first_child, next_token))


# -- verification -------------------------------------------------------------------------


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verify: from the root, repeatedly descend to the first child (in
    sibling order) whose draft token equals the target's prediction at the last
    accepted node, for at most ``accept_index.shape[1] - 1`` levels. Writes the accepted
    flat indices (root first) to ``accept_index``, the number of accepted drafts to
    ``accept_token_num``, and the target token at every accepted node (the last one's
    being the bonus token) to ``predicts``."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    if bs == 0:
        return
    device = candidates.device
    batch = torch.arange(bs, device=device)
    index = retrive_index.to(torch.int64)
    first_child = retrive_next_token.to(torch.int64)
    next_sibling = retrive_next_sibling.to(torch.int64)
    targets = target_predict.reshape(-1)
    out = flat_view(predicts)

    last = index[:, 0].clone()  # flat index of the last accepted node
    accept_index[:, 0] = last.to(accept_index.dtype)
    accepted = torch.zeros(bs, dtype=torch.int64, device=device)
    cur = torch.zeros(bs, dtype=torch.int64, device=device)
    alive = torch.ones(bs, dtype=torch.bool, device=device)
    for _ in range(1, steps):
        if not bool(alive.any()):
            break
        cur = torch.where(alive, first_child[batch, cur], -1)
        target = targets[last]
        matched = torch.zeros(bs, dtype=torch.bool, device=device)
        searching = cur != -1
        for _ in range(n):  # walk the sibling list; bounded against malformed links
            if not bool(searching.any()):
                break
            safe = cur.clamp_min(0)
            hit = searching & (candidates[batch, safe] == target)
            if bool(hit.any()):
                rows = batch[hit]
                out[last[hit]] = target[hit].to(out.dtype)
                accepted[hit] += 1
                accept_index[rows, accepted[hit]] = index[rows, safe[hit]].to(accept_index.dtype)
                last[hit] = index[rows, safe[hit]]
                matched |= hit
            miss = searching & ~hit
            cur = torch.where(miss, next_sibling[batch, safe], cur)
            searching = miss & (cur != -1)
        alive = matched
    flat_view(accept_token_num)[:bs] = accepted.to(accept_token_num.dtype)
    out[last] = targets[last].to(out.dtype)
