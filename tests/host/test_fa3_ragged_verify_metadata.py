"""SUFFIX's ragged chain verify through the host's REAL FA3 backend metadata.

With chain drafts (``SGLANG_SPEC_EXT_USE_TREE=0``, ``--speculative-eagle-topk 1``) on
FA3 the worker takes the host-layout route (``sglang/verify/ragged_backends.py``): the
target forward gets the compact rows (each request's root and its own draft nodes) and
the verify input carries the host's ``RaggedVerifyLayout``. This runs a real (adaptive)
SUFFIX worker step with per-request lengths over the real ``FlashAttentionBackend``
built on CPU by the host's factory, and checks what FA3's own ``init_forward_metadata``
makes of it: query offsets and the longest query from the lengths, KV lengths of
``seq_len + L_i``, and, per request, that the KV slots FA3's page table reads for the
verified positions are exactly the slots the compact forward writes, at the positions
the forward computes. The harness (stand-in model runner and target, the host's GPU
kernels' CPU stand-ins) is ``test_verify_attention_metadata.py``'s; the FA3 kernel
consuming this metadata and its token-bucket graphs need a GPU.
"""

from __future__ import annotations

import numpy as np
import torch

from tests.host.test_verify_attention_metadata import (
    MAX_WIDTH,
    Case,
    install_host_stand_ins,
    ragged_step,
)

#: Per-request verify lengths (root included) forced on the step, cut to its width.
LENS = np.array([MAX_WIDTH, 1, 3], dtype=np.int64)


def test_fa3_reads_the_ragged_chain_layout_suffix_hands_over(monkeypatch):
    install_host_stand_ins(monkeypatch.setattr)
    case = Case("fa3", page_size=1, use_tree=False)
    try:
        assert case.topk == 1
        worker, _drafts, batch, record, lens = ragged_step(case, LENS)
    finally:
        case.close()
    ragged = worker._ragged
    assert ragged.route.host_layout and ragged.route.backend == "FlashAttentionBackend"
    assert "error" not in record, record.get("error")
    assert len(set(lens)) > 1, "the step was not ragged"
    fb, md, backend = record["fb"], record["backend"].forward_metadata, record["backend"]
    layout = record["spec_info"].ragged_verify_layout
    # (read during the forward: the worker drops the layout after it)
    assert fb.input_ids.numel() == sum(lens) and ragged.stats.host_layout_steps == 1
    cu = [0, *np.cumsum(lens).tolist()]
    assert md.cu_seqlens_q.tolist() == cu
    assert md.max_seq_len_q == max(lens)
    seq_lens = batch.seq_lens.tolist()
    assert md.cache_seqlens_int32.tolist() == [s + n for s, n in zip(seq_lens, lens, strict=True)]
    assert md.cu_seqlens_k.tolist() == [0, *np.cumsum(np.add(seq_lens, lens)).tolist()]
    table = backend.req_to_token
    for b, (seq_len, n) in enumerate(zip(seq_lens, lens, strict=True)):
        row = int(batch.req_pool_indices[b])
        # FA3 reads request b's keys through its page table row (page size 1: slots) ...
        read = md.page_table[b, : seq_len + n]
        assert torch.equal(read.to(torch.int64), table[row, : seq_len + n].to(torch.int64))
        # ... and the verified ones are those the compact forward writes, in its order,
        # at the positions it computes (a chain: seq_len + i).
        written = fb.out_cache_loc[cu[b] : cu[b + 1]].to(torch.int64)
        assert written.tolist() == read[seq_len:].to(torch.int64).tolist(), b
        assert fb.positions[cu[b] : cu[b + 1]].tolist() == list(range(seq_len, seq_len + n))
    assert layout is None  # dropped after the forward: the host's verify reads its own
