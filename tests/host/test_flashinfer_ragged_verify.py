"""Ragged verify on the host's flashinfer backend (sglang/verify/flashinfer_ragged.py).

A real (adaptive) SUFFIX worker step with per-request verify lengths over the host's
flashinfer target-verify path: ``FlashInferAttnBackend.init_forward_metadata`` -> the
REAL prefill indices updater -> ``NgramVerifyInput.generate_attn_arg_prefill`` (with the
plugin's hook, registered through the host's ``HookRegistry``) -> the host's KV-index
translator, whose Triton gather runs under Triton's CPU interpreter (a subprocess). The
``flashinfer`` package is CUDA-only, so its wrapper is the one stand-in: it records the
arguments it is planned with (the harness of ``test_verify_attention_metadata.py``).
From those arguments the test computes what flashinfer's batch prefill over a paged KV
cache computes (per request: its queries ``qo_indptr``, its keys ``kv_indices[kv_indptr]``
at page size 1, the flattened ``queries x keys`` custom mask) over a random KV pool; it
must equal the plugin's tree verify of the same drafts and lengths
(``tree_verify_attention``). The host's EAGLE verify input (HYBRID's wide steps) with
the same lengths plans the same. What only a GPU shows: flashinfer's kernel on that plan.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.harness.subproc import interpreted_result

HEADS, KV_HEADS, DIM, SCALE = 4, 2, 16, 0.25


def paged_prefill(q, k_pool, v_pool, plan) -> torch.Tensor:
    """flashinfer's batch prefill with a custom mask, page size 1, on the planned args."""
    qo, kv = plan["qo_indptr"].tolist(), plan["kv_indptr"].tolist()
    mask = plan["custom_mask"].reshape(-1).bool()
    out = torch.zeros(q.shape[0], HEADS, DIM)
    at = 0
    for b in range(len(qo) - 1):
        n, m = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        slots = plan["kv_indices"][kv[b] : kv[b + 1]].long()
        k = k_pool[slots].repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v_pool[slots].repeat_interleave(HEADS // KV_HEADS, dim=1)
        seen = mask[at : at + n * m].view(n, m)
        at += n * m
        scores = torch.einsum("nhd,mhd->hnm", q[qo[b] : qo[b + 1]], k) * SCALE
        scores = scores.masked_fill(~seen, float("-inf"))
        out[qo[b] : qo[b + 1]] = torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v)
    assert at == mask.numel(), f"mask of {mask.numel()} entries, the plan reads {at}"
    return out


def kernel_main(lens: list[int], page_size: int, use_tree: bool, width: int) -> dict:
    """In the interpreted subprocess: one ragged step, then the plan's attention against
    the reference. Returns what the test asserts on."""
    from sglang_spec_ext.sglang.cpu.fallbacks.verify_attention import tree_verify_attention
    from sglang_spec_ext.sglang.verify.flashinfer_ragged import install_flashinfer_ragged
    from tests.host.test_verify_attention_metadata import (
        Case,
        flashinfer_target_verify_backend,
        interpreted_host,
        ragged_step,
    )

    interpreted_host()
    install_flashinfer_ragged()
    case = Case("flashinfer", page_size, use_tree=use_tree)
    try:
        worker, drafts, batch, record, verified = ragged_step(
            case, lens, width, flashinfer_target_verify_backend
        )
        ragged = worker._ragged
    finally:
        case.close()
    if "error" in record:
        return {"error": record["error"]}
    fb, backend = record["fb"], record["backend"]
    plan = backend.prefill_wrappers_verify[0].planned
    tree = drafts[-1][1].reshape(-1, width, width)
    node = np.arange(width)
    ancestors = tree & (node[None, :] < node[:, None])
    parent = np.where(ancestors.any(-1), (ancestors * node).argmax(-1), -1)
    branched = any(np.bincount(p[p >= 0]).max(initial=0) > 1 for p in parent)
    visible = torch.from_numpy(tree).bool() | torch.eye(width, dtype=torch.bool)
    torch.manual_seed(0)
    table = backend.req_to_token
    slots = int(table.max()) + 1
    k_pool, v_pool = torch.randn(slots, KV_HEADS, DIM), torch.randn(slots, KV_HEADS, DIM)
    rows = fb.input_ids.numel()
    q = torch.randn(rows, HEADS, DIM)
    loc = fb.out_cache_loc.to(torch.int64)
    k_pool[loc], v_pool[loc] = torch.randn(rows, KV_HEADS, DIM), torch.randn(rows, KV_HEADS, DIM)
    got = paged_prefill(q, k_pool, v_pool, plan)
    seq_lens = batch.seq_lens.tolist()
    prefix = [table[int(r), :s] for r, s in zip(batch.req_pool_indices.tolist(), seq_lens,
                                                 strict=True)]  # fmt: skip
    want = tree_verify_attention(q, k_pool, v_pool, prefix, loc, visible, scaling=SCALE,
                                 lens=verified)  # fmt: skip
    # HYBRID's wide steps hand the same planner the host's EAGLE verify input: the hook on
    # its generate_attn_arg_prefill, with the same lengths and mask, plans the same.
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    from sglang_spec_ext.sglang.verify.ragged_backends import LENS_ATTR, SEQ_LENS_ATTR

    eagle = object.__new__(EagleVerifyInput)
    eagle.draft_token_num, eagle.custom_mask = width, record["spec_info"].custom_mask
    setattr(eagle, LENS_ATTR, list(verified))
    setattr(eagle, SEQ_LENS_ATTR, batch.seq_lens_cpu)
    kv_indices, kv_indptr, qo_indptr, mask = eagle.generate_attn_arg_prefill(
        req_pool_indices=fb.req_pool_indices, paged_kernel_lens=fb.seq_lens,
        paged_kernel_lens_sum=int(fb.seq_lens.sum()), translator=backend.kv_index_translator,
        plan=fb.kv_loc_plan,
    )  # fmt: skip
    n_kv = int(kv_indptr[-1])
    eagle_same = (
        torch.equal(qo_indptr, plan["qo_indptr"])
        and torch.equal(kv_indptr, plan["kv_indptr"])
        and torch.equal(kv_indices[:n_kv], plan["kv_indices"][:n_kv])
        and torch.equal(mask, plan["custom_mask"])
    )
    # A wrong cut (the padded mask's first rows read as each request's): must differ.
    wrong = dict(plan, custom_mask=record["spec_info"].custom_mask[: plan["custom_mask"].numel()])
    return {
        "lens": verified,
        "rows": rows,
        "qo_indptr": plan["qo_indptr"].tolist(),
        "kv_indptr": plan["kv_indptr"].tolist(),
        "seq_lens": seq_lens,
        "tree": bool(branched),
        "max_abs_diff": float((got - want).abs().max()),
        "wrong_cut_diff": float((paged_prefill(q, k_pool, v_pool, wrong) - want).abs().max()),
        "eagle_verify_input_plans_the_same": eagle_same,
        "route": ragged.route.backend,
        "host_layout": ragged.route.host_layout,
    }


def _run(lens: list[int], page_size: int, use_tree: bool, width: int) -> dict:
    return interpreted_result(
        "tests.host.test_flashinfer_ragged_verify", "kernel_main", lens, page_size, use_tree, width
    )


@pytest.mark.parametrize(
    ("page_size", "use_tree", "lens", "width"),
    [
        pytest.param(1, True, [6, 1, 3], 6, id="page1-tree"),
        pytest.param(1, True, [4, 1, 3], 4, id="page1-tree-width4"),
        pytest.param(16, False, [6, 1, 3], 6, id="page16-chain"),
    ],
)
def test_flashinfer_plans_each_requests_own_draft(page_size, use_tree, lens, width):
    result = _run(lens, page_size, use_tree, width)
    assert "error" not in result, result
    assert result["route"] == "FlashInferAttnBackend" and not result["host_layout"]
    assert result["tree"] == use_tree, "a tree case drafted no tree (or a chain case one)"
    verified = result["lens"]
    assert result["rows"] == sum(verified) and len(set(verified)) > 1
    assert result["qo_indptr"] == [0, *np.cumsum(verified).tolist()]
    kv = np.add(result["seq_lens"], verified)
    assert result["kv_indptr"] == [0, *np.cumsum(kv).tolist()]
    assert result["max_abs_diff"] < 1e-5, result
    assert result["wrong_cut_diff"] > 0.1, result
    assert result["eagle_verify_input_plans_the_same"]
