"""Ragged tree verify on the host's REAL FA3 backend metadata (sglang/verify/fa3_ragged.py).

With tree drafts (``--speculative-eagle-topk`` > 1) on FA3 the worker takes the tree
route (``ragged_backends.py``): the target forward gets the compact rows and the verify
input carries the lengths; the plugin's hook, registered through the host's
``HookRegistry``, cuts the cascade metadata the host's ``FlashAttentionBackend.
init_forward_metadata`` builds (prefix pass and per-draft "expand" pass). This runs a
real (adaptive) SUFFIX worker step with per-request lengths over the real backend (built
on CPU by the host's factory; the harness of ``test_verify_attention_metadata.py``:
stand-in model runner and target, CPU stand-ins of the host's GPU tree kernels), then
computes the verify attention from that metadata the way ``FlashAttentionBackend.
forward_extend`` does for a tree verify: two ``flash_attn_with_kvcache`` calls (the
prefix pass over each request's committed tokens, the expand pass of one query per
verify token over the draft slots its page-table row lists) merged by their
log-sum-exps. The kernel is CUDA-only, so :func:`kvcache_attention` below follows its
documented semantics (varlen queries, a page table of page size 1, ``cache_seqlens``
keys per batch row, non-causal, the LSE returned). The result must equal the plugin's
tree verify of the same requests, drafts and lengths (``tree_verify_attention``, what the
CPU engine serves with). What only a GPU shows: the kernels on this metadata, and the
eager ragged steps beside the ``bs x W`` verify graphs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_spec_ext.sglang.verify.fa3_ragged import cut_tree_metadata, install_fa3_ragged
from tests.host.test_verify_attention_metadata import (
    MAX_WIDTH,
    Case,
    install_host_stand_ins,
    ragged_step,
)

HEADS, KV_HEADS, DIM, SCALE = 4, 2, 16, 0.25


def kvcache_attention(q, k_pool, v_pool, page_table, cache_seqlens, cu_seqlens_q):
    """``flash_attn_with_kvcache(q, k_pool, v_pool, page_table=..., cache_seqlens=...,
    cu_seqlens_q=..., causal=False, return_softmax_lse=True)`` at page size 1: batch row
    ``b``'s queries ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` attend to the slots
    ``page_table[b, :cache_seqlens[b]]``. Returns ``(out, lse)``, lse ``[rows, heads]``."""
    cu = cu_seqlens_q.tolist()
    out = torch.zeros(q.shape[0], HEADS, DIM)
    lse = torch.full((q.shape[0], HEADS), float("-inf"))
    assert len(cu) - 1 <= page_table.shape[0], "more batch rows than page-table rows"
    for b in range(len(cu) - 1):
        rows = q[cu[b] : cu[b + 1]]
        slots = page_table[b, : int(cache_seqlens[b])].long()
        k = k_pool[slots].repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v_pool[slots].repeat_interleave(HEADS // KV_HEADS, dim=1)
        scores = torch.einsum("nhd,mhd->hnm", rows, k) * SCALE
        lse[cu[b] : cu[b + 1]] = torch.logsumexp(scores, dim=-1).T
        out[cu[b] : cu[b + 1]] = torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v)
    return out, lse


def cascade_verify(q, k_pool, v_pool, md, ex):
    """``forward_extend``'s tree verify: prefix pass, expand pass, merged by LSE."""
    o1, lse1 = kvcache_attention(q, k_pool, v_pool, md.page_table, md.cache_seqlens_int32,
                                 md.cu_seqlens_q)  # fmt: skip
    o2, lse2 = kvcache_attention(q, k_pool, v_pool, ex.page_table, ex.cache_seqlens_int32,
                                 ex.cu_seqlens_q)  # fmt: skip
    top = torch.maximum(lse1, lse2)
    w1, w2 = (lse1 - top).exp(), (lse2 - top).exp()
    return (o1 * w1[..., None] + o2 * w2[..., None]) / (w1 + w2)[..., None]


def ragged_tree_step(monkeypatch, lens, width):
    install_host_stand_ins(monkeypatch.setattr)
    install_fa3_ragged()  # the host's HookRegistry (inert without per-request lengths)
    case = Case("fa3", page_size=1, use_tree=True)
    try:
        assert case.topk > 1
        return ragged_step(case, lens, width)
    finally:
        case.close()


@pytest.mark.parametrize(
    ("lens", "width"),
    # At the startup width, and at width 4 (the controller's choice; FA3 sizes its verify
    # metadata at construction, so the worker verifies on a backend built for width 4).
    [
        pytest.param([MAX_WIDTH, 1, 3], MAX_WIDTH, id="startup-width"),
        pytest.param([4, 1, 3], 4, id="width-4"),
    ],
)
def test_fa3_cascade_verify_on_the_cut_metadata_is_the_tree_verify(monkeypatch, lens, width):
    from sglang_spec_ext.sglang.cpu.fallbacks.verify_attention import tree_verify_attention

    worker, drafts, batch, record, verified = ragged_tree_step(monkeypatch, lens, width)
    ragged = worker._ragged
    assert "error" not in record, record.get("error")
    assert ragged.route.backend == "FlashAttentionBackend" and not ragged.route.host_layout
    assert ragged.stats.host_layout_steps == 0
    tree = drafts[-1][1].reshape(-1, width, width)  # the drafts at the step's width
    node = np.arange(width)
    ancestors = tree & (node[None, :] < node[:, None])
    parent = np.where(ancestors.any(-1), (ancestors * node).argmax(-1), -1)
    assert any(np.bincount(p[p >= 0]).max(initial=0) > 1 for p in parent), "no tree drafted"
    assert len(set(verified)) > 1, "the step was not ragged"
    fb, backend = record["fb"], record["backend"]
    md, ex = backend.forward_metadata, backend.forward_metadata_spec_decode_expand
    assert int(backend.speculative_num_draft_tokens) == width
    total = sum(verified)
    assert fb.input_ids.numel() == total
    cu = [0, *np.cumsum(verified).tolist()]
    assert md.cu_seqlens_q.tolist() == cu and md.max_seq_len_q == max(verified)
    assert md.cache_seqlens_int32.tolist() == batch.seq_lens.tolist()  # prefix unchanged
    assert ex.cu_seqlens_q.tolist() == list(range(total + 1))
    assert ex.page_table.shape[0] == total and ex.cache_seqlens_int32.numel() == total
    assert ex.cu_seqlens_k.tolist() == [0, *np.cumsum(ex.cache_seqlens_int32).tolist()]

    # Attention from the cut metadata, as FA3 computes it, against the plugin's tree verify.
    visible = torch.from_numpy(tree).bool() | torch.eye(width, dtype=torch.bool)
    torch.manual_seed(0)
    table = backend.req_to_token
    slots = int(table.max()) + 1
    k_pool, v_pool = torch.randn(slots, KV_HEADS, DIM), torch.randn(slots, KV_HEADS, DIM)
    q = torch.randn(total, HEADS, DIM)
    loc = fb.out_cache_loc.to(torch.int64)
    k_pool[loc], v_pool[loc] = torch.randn(total, KV_HEADS, DIM), torch.randn(total, KV_HEADS, DIM)
    got = cascade_verify(q, k_pool, v_pool, md, ex)
    prefix = [
        table[int(r), :s]
        for r, s in zip(batch.req_pool_indices.tolist(), batch.seq_lens.tolist(), strict=True)
    ]
    want = tree_verify_attention(q, k_pool, v_pool, prefix, loc, visible, scaling=SCALE,
                                 lens=verified)  # fmt: skip
    assert float((got - want).abs().max()) < 1e-5

    # The same computation on a wrong cut (every request's rows taken from the first
    # request's block) differs: the check sees which rows the expand pass keeps.
    wrong = type(ex)()
    wrong.page_table = ex.page_table[torch.arange(total) % verified[0]]
    wrong.cache_seqlens_int32 = ex.cache_seqlens_int32[torch.arange(total) % verified[0]]
    wrong.cu_seqlens_q = ex.cu_seqlens_q
    assert float((cascade_verify(q, k_pool, v_pool, md, wrong) - want).abs().max()) > 0.1


def test_the_cut_keeps_each_requests_first_rows_and_refuses_bad_lengths():
    from types import SimpleNamespace

    width, lens = 4, [2, 4, 1]
    rows = torch.arange(3 * width)
    ex = SimpleNamespace(
        page_table=torch.stack([rows, rows + 100], dim=1).to(torch.int32),
        cache_seqlens_int32=(rows % width + 1).to(torch.int32),
    )
    md = SimpleNamespace(cu_seqlens_q=torch.arange(0, 3 * width + 1, width, dtype=torch.int32),
                         max_seq_len_q=width)  # fmt: skip
    backend = SimpleNamespace(forward_metadata=md, forward_metadata_spec_decode_expand=ex,
                              speculative_num_draft_tokens=width)  # fmt: skip
    cut_tree_metadata(backend, lens)
    kept = [0, 1, 4, 5, 6, 7, 8]
    assert ex.page_table[:, 0].tolist() == kept
    assert ex.cache_seqlens_int32.tolist() == [1, 2, 1, 2, 3, 4, 1]
    assert ex.cu_seqlens_k.tolist() == [0, 1, 3, 4, 6, 9, 13, 14]
    assert ex.cu_seqlens_q.tolist() == list(range(8)) and ex.cu_seqlens_q.dtype == torch.int32
    assert md.cu_seqlens_q.tolist() == [0, 2, 6, 7] and md.cu_seqlens_q.dtype == torch.int32
    assert md.max_seq_len_q == 4
    with pytest.raises(ValueError, match="outside 1..4"):
        cut_tree_metadata(backend, [5, 1, 1])


def test_fixed_suffix_builds_fa3_backends_for_shorter_steps_at_start_up(monkeypatch):
    """FA3 sizes its verify metadata at construction, so a ragged step verified at the
    batch's longest draft needs a backend of that width: fixed SUFFIX builds them at
    start-up (not inside a decode step); where they cannot be built, ragged steps verify
    at the whole width. Backends that read the width per step (flashinfer) build none."""
    from sglang_spec_ext.sglang.workers.adaptive_worker import AdaptiveSuffixWorker
    from sglang_spec_ext.sglang.workers.suffix_worker import SuffixWorker

    install_host_stand_ins(monkeypatch.setattr)
    # The harness's worker as the fixed-width one starts: SuffixWorker's start-up, which
    # leaves the widths to the ragged set-up (adaptive SUFFIX builds every width itself).
    monkeypatch.setattr(AdaptiveSuffixWorker, "init_cuda_graphs", SuffixWorker.init_cuda_graphs)
    monkeypatch.setattr(AdaptiveSuffixWorker, "PREPARES_EVERY_WIDTH", False)
    from tests.host.test_verify_attention_metadata import flashinfer_target_verify_backend

    for backend in ("fa3", "flashinfer"):
        case = Case(backend, page_size=1, use_tree=True)
        try:
            built: list[int] = []
            startup = flashinfer_target_verify_backend if backend == "flashinfer" else None
            worker, _drafts = case.make_worker(None, startup, built)
            worker._init_ragged()
            before = len(built)
            worker._prepare_shorter_widths()
            if backend == "flashinfer":
                assert len(built) == before and worker._verify_backends is None
                continue
            assert len(built) == before + MAX_WIDTH - 2  # widths 2 .. W-1
            for width in range(2, MAX_WIDTH):
                assert worker._verify_backends.backend(width).speculative_num_draft_tokens == width
            assert len(built) == before + MAX_WIDTH - 2 and worker._shorter_steps

            def refuses(runner):
                raise RuntimeError("no FA3 here")

            worker, _drafts = case.make_worker(
                refuses,
                lambda r: type(
                    "FlashAttentionBackend", (), {"speculative_num_draft_tokens": MAX_WIDTH}
                )(),
            )
            worker._init_ragged()
            worker._prepare_shorter_widths()
            assert not worker._shorter_steps  # ragged steps at the whole width instead
        finally:
            case.close()
