"""Ragged tree verify on the host's triton backend (sglang/verify/triton_ragged.py), with
the host's REAL triton attention kernel run by Triton's CPU interpreter.

A real (adaptive) SUFFIX worker step with per-request verify lengths over the real
``TritonAttnBackend`` (built on CPU by the host's factory; the harness of
``test_verify_attention_metadata.py``: stand-in model runner and target, CPU stand-ins of
the host's GPU tree kernels), the plugin's metadata hook registered through the host's
``HookRegistry``. Then the host's own ``extend_attention_fwd`` (the kernel
``TritonAttnBackend.forward_extend`` runs for a verify), interpreted
(``TRITON_INTERPRET=1``, in a subprocess), computes the compact verify's attention from
that metadata over a random KV pool; it must equal the plugin's tree verify of the same
requests, drafts and lengths (``tree_verify_attention``, the reference the CPU engine
serves with). What only a GPU shows: the compiled kernel's speed and the eager fallback
of ragged steps beside the ``bs x W`` verify graphs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_spec_ext.sglang.verify.triton_ragged import ragged_full_mask
from tests.harness.subproc import interpreted_result


def test_full_mask_cut_keeps_each_requests_rows_and_columns():
    width, seq_lens, lens = 4, np.array([3, 5, 2]), np.array([2, 4, 1])
    blocks, want = [], []
    g = torch.Generator().manual_seed(0)
    for s, n in zip(seq_lens, lens, strict=True):
        block = torch.rand(width, s + width, generator=g) > 0.5
        blocks.append(block.flatten())
        want.append(block[:n, : s + n].flatten())
    got, indptr = ragged_full_mask(torch.cat(blocks), seq_lens, lens, width)
    assert torch.equal(got, torch.cat(want))
    assert indptr.tolist() == [0, 10, 46, 49]


def kernel_main(lens: list[int], page_size: int, use_tree: bool) -> dict:
    """In the interpreted subprocess: one ragged step, then the kernel against the
    reference. Returns what the test asserts on."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    from sglang_spec_ext.sglang.cpu.fallbacks.verify_attention import tree_verify_attention
    from sglang_spec_ext.sglang.verify.triton_ragged import install_triton_ragged
    from tests.host.test_verify_attention_metadata import (
        MAX_WIDTH,
        Case,
        has_branches,
        interpreted_host,
        ragged_step,
    )

    interpreted_host()
    install_triton_ragged()
    case = Case("triton", page_size, use_tree=use_tree)
    try:
        # The host's factory builds the real backend.
        worker, drafts, batch, record, verified = ragged_step(case, lens)
        ragged = worker._ragged
    finally:
        case.close()
    if "error" in record:
        return {"error": record["error"]}
    fb, md = record["fb"], record["backend"].forward_metadata
    tree = drafts[-1][1].reshape(-1, MAX_WIDTH, MAX_WIDTH)
    visible = torch.from_numpy(tree).bool() | torch.eye(MAX_WIDTH, dtype=torch.bool)
    # A KV pool; the verified tokens' K/V written where the compact forward writes them.
    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 16
    table = record["backend"].req_to_token
    slots = int(table.max()) + 1
    k_buffer, v_buffer = torch.randn(slots, kv_heads, dim), torch.randn(slots, kv_heads, dim)
    rows = fb.input_ids.numel()
    q = torch.randn(rows, heads, dim)
    k, v = torch.randn(rows, kv_heads, dim), torch.randn(rows, kv_heads, dim)
    loc = fb.out_cache_loc.to(torch.int64)
    k_buffer[loc], v_buffer[loc] = k, v
    out = torch.empty(rows, heads, dim)
    extend_attention_fwd(
        q, k, v, out, k_buffer, v_buffer, md.qo_indptr, md.kv_indptr, md.kv_indices,
        md.custom_mask, True, md.mask_indptr, md.max_extend_len, 1.0, 1.0, sm_scale=0.25,
    )  # fmt: skip
    seq_lens = batch.seq_lens.tolist()
    prefix = [
        table[int(r), :s] for r, s in zip(batch.req_pool_indices.tolist(), seq_lens, strict=True)
    ]
    want = tree_verify_attention(
        q, k_buffer, v_buffer, prefix, loc, visible, scaling=0.25, lens=verified
    )
    return {
        "lens": verified,
        "rows": rows,
        "qo_indptr": md.qo_indptr.tolist(),
        "max_extend_len": int(md.max_extend_len),
        "tree": bool(has_branches(drafts[-1][1])),
        "max_abs_diff": float((out - want).abs().max()),
        "host_layout_steps": ragged.stats.host_layout_steps,
        "route": ragged.route.backend,
    }


def _run(lens: list[int], page_size: int, use_tree: bool) -> dict:
    return interpreted_result(
        "tests.host.test_triton_ragged_verify", "kernel_main", lens, page_size, use_tree
    )


@pytest.mark.parametrize(
    ("page_size", "use_tree"),
    # Trees on triton need page size 1 (the server-args hook refuses others): chains at 16.
    [pytest.param(1, True, id="page1-tree"), pytest.param(16, False, id="page16-chain")],
)
def test_the_hosts_triton_kernel_verifies_each_requests_own_draft(page_size, use_tree):
    result = _run([6, 1, 3], page_size, use_tree)
    assert "error" not in result, result
    assert result["route"] == "TritonAttnBackend" and result["host_layout_steps"] == 0
    assert result["tree"] == use_tree, "a tree case drafted no tree (or a chain case one)"
    lens = result["lens"]
    assert result["rows"] == sum(lens) and len(set(lens)) > 1
    assert result["qo_indptr"] == [0, *np.cumsum(lens).tolist()]
    assert result["max_extend_len"] == max(lens)
    assert result["max_abs_diff"] < 1e-4, result
