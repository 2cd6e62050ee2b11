"""Ragged tree verify on the host's FA3 attention backend.

With tree drafts (``--speculative-eagle-topk`` > 1, SUFFIX's default) the host's
``FlashAttentionBackend`` verifies in two passes whose outputs it merges by their
log-sum-exps (cascade attention, ``forward_extend``):

* the **prefix pass**: every verify token of request ``b`` attends, non-causally, to the
  request's committed tokens (``cu_seqlens_q`` per request, ``cache_seqlens = seq_len``,
  the request's page-table row);
* the **expand pass**: each verify token is a batch of its own (one query) attending to
  the draft tokens it sees: itself and its ancestors (``forward_metadata_spec_decode_
  expand``: one page-table row per verify token, the visible draft slots first, and
  ``cache_seqlens`` their count, both extracted from the tree mask).

Both passes are varlen kernels driven by metadata; only the metadata the host builds for
a verify is uniform: ``W`` query rows per request, ``bs x W`` expand rows.
:func:`fa3_tree_metadata_hook` (AROUND ``FlashAttentionBackend.init_forward_metadata``)
makes it ragged where a SUFFIX verify carries per-request lengths (``ragged_lens_cpu``,
``ragged_backends.py``'s tree route): after the host built the uniform metadata, the
prefix pass's query offsets become the lengths' (``[0, L_0, L_0 + L_1, ...]``) and its
longest query ``max L_i``; the expand pass keeps the rows of each request's first
``L_i`` draft tokens (the draft's real nodes, in order: a node's ancestors come before
it, so its visible slots and their count are those the host extracted) and its
cumulative key lengths follow. The committed part (KV lengths, page table) is unchanged.

Eager only: FA3's verify graphs with trees are captured for ``bs x W`` tokens, and the
host's graph runner sends a compact NGRAM-shaped batch eager (its ``is_ngram_supported``
check). Not with sliding-window layers (their verify metadata is built per token and the
prefix pass runs uncascaded there) or chunked local attention
(``ragged_backends.fa3_tree_ragged_problem`` keeps those padded). Page size 1: the
server-args hook refuses tree drafts on FA3 above it.

No host sync: the lengths are host values; the row indices and query offsets go to the
device in one non-blocking copy, and the expand pass's key offsets are a device cumsum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from sglang_spec_ext.sglang.verify.ragged_backends import LENS_ATTR, to_device
from sglang_spec_ext.verify.layout import kept_rows

#: The host method the hook wraps.
METADATA_TARGET = (
    "sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend.init_forward_metadata"
)


def cut_tree_metadata(backend: Any, lens: list[int] | np.ndarray) -> None:
    """Cut the uniform tree-verify metadata ``backend`` just built to ``lens`` tokens per
    request (root included; module doc)."""
    md, ex = backend.forward_metadata, backend.forward_metadata_spec_decode_expand
    width = int(backend.speculative_num_draft_tokens)
    lens_np = np.asarray(lens, dtype=np.int64)
    bs, total = lens_np.size, int(lens_np.sum())
    if lens_np.min(initial=1) < 1 or lens_np.max(initial=1) > width:
        raise ValueError(f"ragged verify lengths {lens_np.tolist()} outside 1..{width}")
    host = np.concatenate([[0], np.cumsum(lens_np), kept_rows(lens_np, width)])
    dev = to_device(torch.from_numpy(host), md.cu_seqlens_q.device)
    md.cu_seqlens_q = dev[: bs + 1].to(torch.int32)
    md.max_seq_len_q = int(lens_np.max())
    keep = dev[bs + 1 :]
    ex.page_table = ex.page_table.index_select(0, keep)
    ex.cache_seqlens_int32 = ex.cache_seqlens_int32.index_select(0, keep)
    ex.cu_seqlens_k = torch.nn.functional.pad(
        torch.cumsum(ex.cache_seqlens_int32, dim=0, dtype=torch.int32), (1, 0)
    )
    ex.cu_seqlens_q = torch.arange(total + 1, dtype=torch.int32, device=keep.device)


def fa3_tree_metadata_hook(original: Callable[..., Any], backend: Any, forward_batch: Any) -> Any:
    """AROUND ``FlashAttentionBackend.init_forward_metadata``: a tree verify carrying
    per-request lengths gets ragged prefix and expand metadata (module doc)."""
    out = original(backend, forward_batch)
    spec_info = forward_batch.spec_info
    lens = getattr(spec_info, LENS_ATTR, None) if spec_info is not None else None
    if lens is None or int(backend.topk) <= 1 or not forward_batch.forward_mode.is_target_verify():
        return out
    cut_tree_metadata(backend, lens)
    return out


def install_fa3_ragged() -> list[str]:
    """Register the hook (inert unless a tree verify carries per-request lengths)."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once([(METADATA_TARGET, fa3_tree_metadata_hook, HookType.AROUND)])
    return ["fa3_ragged"]
