"""The CPU engine's reading of the host-layout route (cpu/causal_ragged_attention.py): FA3's
causal varlen semantics on the geometry the host's own builder makes from the layout equal
the plugin's tree verify of the same chains, request by request. Served end to end in
tests/e2e/test_ragged_verify.py (chain drafts)."""

from __future__ import annotations

import pytest
import torch
from sglang.srt.speculative.ragged_verify import build_ragged_target_verify_geometry

from sglang_spec_ext.sglang.cpu.causal_ragged_attention import varlen_causal_attention
from sglang_spec_ext.sglang.cpu.fallbacks.verify_attention import tree_verify_attention
from sglang_spec_ext.sglang.verify.ragged_backends import layout_from_lens


def _paged(prefix_lens, lens, slots=96, kv_heads=2, dim=8, seed=0):
    """A KV pool, each request's committed then verified slots (scattered), a page table."""
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(slots, kv_heads, dim, generator=g)
    v_cache = torch.randn(slots, kv_heads, dim, generator=g)
    perm = torch.randperm(slots, generator=g)
    prefix, draft, start = [], [], 0
    for p, n in zip(prefix_lens, lens, strict=True):
        prefix.append(perm[start : start + p])
        draft.append(perm[start + p : start + p + n])
        start += p + n
    width = max(p + n for p, n in zip(prefix_lens, lens, strict=True))
    table = torch.zeros(len(lens), width, dtype=torch.int64)
    for b, (pre, dr) in enumerate(zip(prefix, draft, strict=True)):
        table[b, : len(pre) + len(dr)] = torch.cat([pre, dr])
    return k_cache, v_cache, prefix, torch.cat(draft), table


@pytest.mark.parametrize("window", [None, 3])
def test_causal_varlen_on_the_hosts_geometry_equals_the_tree_verify_of_chains(window):
    prefix_lens, lens = [4, 7, 2, 5], [3, 1, 5, 2]
    heads, dim = 4, 8
    k_cache, v_cache, prefix, draft_slots, table = _paged(prefix_lens, lens, dim=dim)
    q = torch.randn(sum(lens), heads, dim, generator=torch.Generator().manual_seed(1))
    layout = layout_from_lens(lens, "cpu")
    geometry = build_ragged_target_verify_geometry(
        seq_lens=torch.tensor(prefix_lens), layout=layout
    )
    got = varlen_causal_attention(
        q, k_cache, v_cache, table, geometry.cache_seqlens_int32, geometry.cu_seqlens_q,
        scaling=0.3, sliding_window=window,
    )  # fmt: skip
    width = max(lens)
    chains = torch.ones(width, width, dtype=torch.bool).tril().expand(len(lens), width, width)
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(prefix_lens, lens, strict=True)])
    want = tree_verify_attention(
        q, k_cache, v_cache, prefix, draft_slots, chains, scaling=0.3,
        query_positions=positions, sliding_window=window, lens=lens,
    )  # fmt: skip
    if window is None:
        torch.testing.assert_close(got, want)
    else:
        # FA's window also drops old *verified* keys; the tree verify windows the prefix
        # only. Equal wherever no verified key falls out of a query's window.
        torch.testing.assert_close(got[: lens[0] + lens[1]], want[: lens[0] + lens[1]])


def test_a_buckets_padding_rows_come_back_zero():
    prefix_lens, lens = [3, 6], [2, 3]
    k_cache, v_cache, _prefix, _draft, table = _paged(prefix_lens, lens)
    q = torch.randn(8, 4, 8)  # a bucket of 8 for 5 verified tokens
    layout = layout_from_lens(lens, "cpu", graph_num_tokens=8)
    geometry = build_ragged_target_verify_geometry(
        seq_lens=torch.tensor(prefix_lens), layout=layout
    )
    out = varlen_causal_attention(
        q, k_cache, v_cache, table, geometry.cache_seqlens_int32, geometry.cu_seqlens_q
    )
    assert out.shape == (8, 4, 8)
    assert out[5:].abs().sum() == 0 and out[:5].abs().sum() > 0
