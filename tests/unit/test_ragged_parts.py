"""Ragged verify's pieces without a server (sglang/verify/ragged.py, the CPU verify
attention's per-request lengths). Served end to end in tests/e2e/test_ragged_verify.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_spec_ext.sglang.cpu.fallbacks.verify_attention import tree_verify_attention
from sglang_spec_ext.sglang.verify.ragged import RaggedTarget, RaggedVerify, draft_lens
from sglang_spec_ext.sglang.verify.ragged_backends import LENS_ATTR, RaggedRoute, ragged_route
from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.verify.layout import pack_batch, retrieve_links


def test_ragged_attention_equals_the_padded_rows_it_keeps():
    torch.manual_seed(0)
    width, heads, kv_heads, dim = 6, 4, 2, 8
    trees = [DraftTree([5, 6, 7], [-1, 0, 0]), DraftTree(), DraftTree([9], [-1])]
    lens = draft_lens([len(t) for t in trees], width)
    _tokens, mask = pack_batch(trees, [1, 2, 3], width)
    visible = torch.from_numpy(mask.reshape(3, width, width))
    prefix_lens = [4, 7, 2]
    slots = 64
    k_cache = torch.randn(slots, kv_heads, dim)
    v_cache = torch.randn(slots, kv_heads, dim)
    perm = torch.randperm(slots)
    prefix, start = [], 0
    for n in prefix_lens:
        prefix.append(perm[start : start + n])
        start += n
    draft_slots = perm[start : start + 3 * width].view(3, width)
    q = torch.randn(3 * width, heads, dim)
    padded = tree_verify_attention(q, k_cache, v_cache, prefix, draft_slots, visible)
    keep = torch.cat([torch.arange(b * width, b * width + n) for b, n in enumerate(lens)])
    ragged = tree_verify_attention(
        q[keep], k_cache, v_cache, prefix, draft_slots.reshape(-1)[keep], visible,
        lens=lens.tolist(),
    )  # fmt: skip
    assert ragged.shape[0] == int(lens.sum())
    torch.testing.assert_close(ragged, padded[keep])


def _batch(trees, width):
    bs = len(trees)
    tokens, mask = pack_batch(trees, list(range(1, bs + 1)), width)
    links = np.concatenate([retrieve_links(t.parents, width)[0] for t in trees])
    spec_info = SimpleNamespace(
        retrieve_next_token=torch.from_numpy(links.copy()),
        positions=torch.arange(bs * width),
        custom_mask=torch.from_numpy(mask),
    )
    return SimpleNamespace(
        reqs=[object()] * bs,
        forward_mode=SimpleNamespace(is_target_verify=lambda: True),
        spec_info=spec_info,
        input_ids=torch.from_numpy(tokens),
        out_cache_loc=torch.arange(100, 100 + bs * width),
    )


def test_plan_cuts_the_padding_off_and_keeps_each_requests_rows():
    width = 5
    trees = [DraftTree([7, 8], [-1, 0]), DraftTree(), DraftTree([1, 2, 3, 4], [-1, 0, 1, 2])]
    batch = _batch(trees, width)
    before = batch.spec_info.retrieve_next_token.clone()
    ragged = RaggedVerify()
    ragged.set_lens(draft_lens([len(t) for t in trees], width))
    ragged.plan(batch, width)
    plan = ragged.plan_now
    assert plan.lens == [3, 1, 5]
    assert plan.keep.tolist() == [0, 1, 2, 5, 10, 11, 12, 13, 14]
    links = batch.spec_info.retrieve_next_token.view(3, width)
    # Each padded request's last real node no longer leads into its padding ...
    assert before.view(3, width)[0, 2] == 3 and links[0, 2] == -1
    assert before.view(3, width)[1, 0] == 1 and links[1, 0] == -1
    # ... and nothing else changed (the full request keeps its chain).
    links[0, 2], links[1, 0] = before.view(3, width)[0, 2], before.view(3, width)[1, 0]
    assert torch.equal(batch.spec_info.retrieve_next_token, before)
    stats = ragged.stats_dict()
    assert stats["ragged_verify_steps"] == 1
    assert stats["verify_tokens_per_step"] == 9 and stats["padded_verify_tokens_per_step"] == 15


def test_nothing_is_planned_where_every_request_is_full_or_lengths_are_stale():
    width = 3
    trees = [DraftTree([7, 8], [-1, 0])] * 2
    batch = _batch(trees, width)
    ragged = RaggedVerify()
    ragged.set_lens(draft_lens([2, 2], width))
    ragged.plan(batch, width)
    assert ragged.plan_now is None and ragged.stats.steps == 1
    ragged.set_lens(np.array([1, 1, 1]))  # set for another batch size
    ragged.plan(batch, width)
    assert ragged.plan_now is None
    with pytest.raises(ValueError, match="outside 1..3"):
        ragged.set_lens(np.array([4, 1]))
        ragged.plan(batch, width)
    with pytest.raises(ValueError, match="exceeds verify width"):
        draft_lens([3], 3)


class _Target:
    """Stands in for the host's TpModelWorker: records what the forward saw."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.seen, self.other = fail, None, "delegated"

    def forward_batch_generation(self, batch, **kwargs):
        spec = batch.spec_info
        self.seen = (batch.input_ids.clone(), batch.out_cache_loc.clone(),
                     spec.positions.clone(), getattr(spec, LENS_ATTR, None))  # fmt: skip
        self.layout = getattr(spec, "ragged_verify_layout", None)
        if self.fail:
            raise RuntimeError("forward failed")
        n = batch.input_ids.numel()
        logits = torch.arange(n, dtype=torch.float32)[:, None].repeat(1, 4) + 1
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits,
                                                             hidden_states=None))  # fmt: skip


def test_the_target_sees_the_compact_batch_and_the_verify_gets_padded_rows_back():
    width = 4
    trees = [DraftTree([7], [-1]), DraftTree([5, 6, 9], [-1, 0, 1])]
    batch = _batch(trees, width)
    ids, locs, pos = batch.input_ids.clone(), batch.out_cache_loc.clone(), batch.spec_info.positions
    ragged = RaggedVerify()
    ragged.set_lens(draft_lens([1, 3], width))
    ragged.plan(batch, width)
    target = _Target()
    wrapped = ragged.target(target)
    assert isinstance(wrapped, RaggedTarget) and wrapped.other == "delegated"
    out = wrapped.forward_batch_generation(batch, is_verify=True).logits_output
    seen_ids, seen_locs, seen_pos, seen_lens = target.seen
    keep = [0, 1, 4, 5, 6, 7]
    assert seen_ids.tolist() == ids[keep].tolist() and seen_locs.tolist() == locs[keep].tolist()
    assert seen_pos.tolist() == keep and seen_lens == [2, 4]
    # Padded back: kept rows in place, padding rows zero; the batch as the host built it.
    assert out.next_token_logits.shape == (8, 4)
    assert out.next_token_logits[:, 0].tolist() == [1, 2, 0, 0, 3, 4, 5, 6]
    assert torch.equal(batch.input_ids, ids) and torch.equal(batch.out_cache_loc, locs)
    assert batch.spec_info.positions is pos and getattr(batch.spec_info, LENS_ATTR) is None
    assert ragged.target(target) is target  # one plan, one forward


def test_a_failed_forward_still_restores_the_batch():
    width = 3
    batch = _batch([DraftTree(), DraftTree([4], [-1])], width)
    ids, locs = batch.input_ids.clone(), batch.out_cache_loc.clone()
    ragged = RaggedVerify()
    ragged.set_lens(np.array([1, 2]))
    ragged.plan(batch, width)
    with pytest.raises(RuntimeError, match="forward failed"):
        ragged.target(_Target(fail=True)).forward_batch_generation(batch, is_verify=True)
    assert torch.equal(batch.input_ids, ids) and torch.equal(batch.out_cache_loc, locs)
    assert getattr(batch.spec_info, LENS_ATTR) is None


def test_routes_per_backend_and_draft_shape():
    class TorchNativeAttnBackend:  # noqa: N801 - named as the host's class
        pass

    class FlashAttentionBackend:  # noqa: N801 - stands in for FA3 (needs a GPU)
        has_swa = False
        use_sliding_window_kv_pool = False
        local_attn_builder = None

    class TRTLLMHAAttnBackend:  # noqa: N801 - stands in for trtllm_mha (needs a GPU)
        pass

    class TritonAttnBackend:  # noqa: N801 - the host's triton: ragged via its metadata
        enable_deterministic = False
        sliding_window_size = None

    class FlashInferAttnBackend:  # noqa: N801 - stands in for flashinfer (needs a GPU)
        use_sliding_window_kv_pool = False
        indices_updater_prefill = None

    def route(backend, chains):
        return ragged_route(SimpleNamespace(attn_backend=backend()), chains)

    tree, problem = route(TorchNativeAttnBackend, chains=False)
    assert problem is None and not tree.host_layout
    chain, problem = route(TorchNativeAttnBackend, chains=True)
    assert problem is None and chain.host_layout  # FA3's contract, emulated on the CPU
    fa3, problem = route(FlashAttentionBackend, chains=True)
    assert problem is None and fa3.host_layout and "FlashAttentionBackend" in fa3.describe()
    # Trees on FA3: its cascade verify's metadata cut to the lengths (fa3_ragged.py).
    fa3_tree, problem = route(FlashAttentionBackend, chains=False)
    assert problem is None and not fa3_tree.host_layout and "FA3 tree" in fa3_tree.describe()
    FlashAttentionBackend.has_swa = True
    none, problem = route(FlashAttentionBackend, chains=False)
    assert none is None and "sliding-window" in problem and "padded" in problem
    fa3, problem = route(FlashAttentionBackend, chains=True)  # chains do not care
    assert problem is None and fa3.host_layout
    none, problem = route(TRTLLMHAAttnBackend, chains=False)
    assert none is None and "SGLANG_SPEC_EXT_USE_TREE=0" in problem and "causal" in problem
    triton, problem = route(TritonAttnBackend, chains=False)
    assert problem is None and not triton.host_layout  # trees too (triton_ragged.py)
    TritonAttnBackend.enable_deterministic = True  # its unified kernel: one width
    none, problem = route(TritonAttnBackend, chains=False)
    assert none is None and "deterministic" in problem and "padded" in problem
    # flashinfer: the verify input plans per request (flashinfer_ragged.py), trees and
    # chains; not with its sliding-window layers.
    for chains in (False, True):
        fi, problem = route(FlashInferAttnBackend, chains=chains)
        assert problem is None and not fi.host_layout and "flashinfer" in fi.describe()
    FlashInferAttnBackend.use_sliding_window_kv_pool = True
    none, problem = route(FlashInferAttnBackend, chains=False)
    assert none is None and "sliding-window" in problem

    class AiterAttnBackend:  # noqa: N801 - any other backend: padded, and says so
        pass

    none, problem = route(AiterAttnBackend, chains=True)
    assert none is None and "AiterAttnBackend" in problem and "padded" in problem


def test_the_host_layout_route_hands_the_forward_the_hosts_layout():
    from sglang.srt.speculative.ragged_verify import (
        RaggedVerifyLayout,
        build_ragged_target_verify_geometry,
    )

    width = 4
    batch = _batch([DraftTree([7], [-1]), DraftTree([5, 6, 9], [-1, 0, 1])], width)
    ragged = RaggedVerify(RaggedRoute("FlashAttentionBackend", host_layout=True))
    ragged.set_lens(draft_lens([1, 3], width))
    ragged.plan(batch, width)
    target = _Target()
    ragged.target(target).forward_batch_generation(batch, is_verify=True)
    layout = target.layout
    assert isinstance(layout, RaggedVerifyLayout) and target.seen[3] is None
    assert layout.verify_lens_cpu == [2, 4] and layout.graph_num_tokens == 6
    host = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=[2, 4], device="cpu", grid=[6])
    for field in ("verify_lens", "qo_indptr_device", "extend_start_loc"):
        assert torch.equal(getattr(layout, field), getattr(host, field)), field
    # What FA3 builds from it: the compact rows in request order, each request's keys its
    # committed tokens plus its own verified ones.
    geometry = build_ragged_target_verify_geometry(seq_lens=torch.tensor([5, 9]), layout=layout)
    assert geometry.cu_seqlens_q.tolist() == [0, 2, 6]
    assert geometry.cache_seqlens_int32.tolist() == [7, 13]
    assert batch.spec_info.ragged_verify_layout is None  # dropped after the forward


def test_batches_a_verify_graph_holds_stay_padded_where_ragged_would_run_eagerly():
    width = 4
    small = _batch([DraftTree([7], [-1]), DraftTree([5, 6, 9], [-1, 0, 1])], width)
    large = _batch([DraftTree([7], [-1]), DraftTree(), DraftTree([5, 6, 9], [-1, 0, 1])], width)
    ragged = RaggedVerify()
    ragged.graph_bs_limit = 2  # graphs captured up to batch 2 (SGLANG_SPEC_EXT_RAGGED_EAGER=auto)
    links = small.spec_info.retrieve_next_token.clone()
    ragged.set_lens(draft_lens([1, 3], width))
    ragged.plan(small, width)
    assert ragged.plan_now is None and ragged.stats.graph_kept_steps == 1
    assert torch.equal(small.spec_info.retrieve_next_token, links)  # the tree left whole
    ragged.set_lens(draft_lens([1, 0, 3], width))
    ragged.plan(large, width)  # past the graphs: eager either way, so ragged
    assert ragged.plan_now is not None and ragged.plan_now.lens == [2, 1, 4]
    stats = ragged.stats_dict()
    assert stats["ragged_verify_steps"] == 1 and stats["graph_kept_verify_steps"] == 1


def test_a_step_that_keeps_its_graph_verifies_at_a_width_a_graph_holds():
    """Under RAGGED_EAGER=auto on a GPU, a batch the verify graphs hold stays padded so
    its graph replays; verifying it at its longest draft instead would run eagerly (no
    graph at that width) and still padded. So it verifies at the startup width, unless
    the narrower width has graphs of its own (adaptive SUFFIX's per-width graphs)."""
    from sglang_spec_ext.sglang.workers.suffix_ragged import RaggedStepsMixin

    class Backends:
        def __init__(self, graphs: dict) -> None:
            self.graphs = graphs

        def graph_runner(self, width):
            return self.graphs.get(width)

    ragged = RaggedVerify()
    worker = SimpleNamespace(_shorter_steps=True, _ragged=ragged, _verify_backends=None)
    fits = RaggedStepsMixin._shorter_fits
    assert fits(worker, 4, 5)  # no graph limit: the narrower verify (ragged, eager)
    ragged.graph_bs_limit = 8
    assert not fits(worker, 4, 5)  # the batch keeps its startup-width graph
    assert fits(worker, 9, 5)  # past the graphs: eager either way
    worker._verify_backends = Backends({5: SimpleNamespace(max_bs=8)})
    assert fits(worker, 4, 5) and not fits(worker, 4, 6)  # width 5 has graphs holding 4
    worker._shorter_steps = False  # no backend per shorter width (FA3 could not build one)
    assert not fits(worker, 9, 5)


@pytest.mark.parametrize(
    ("device", "graphs", "policy", "limit"),
    [
        ("cuda", True, "auto", 8),
        ("cuda", True, "always", None),
        ("cuda", False, "auto", None),
        ("cpu", True, "auto", None),
    ],  # fmt: skip
)
def test_the_eager_policy_sets_the_graph_limit_on_a_gpu_only(device, graphs, policy, limit):
    from sglang_spec_ext.sglang.workers.suffix_ragged import RaggedStepsMixin

    runner = SimpleNamespace(max_bs=8) if graphs else None
    model_runner = SimpleNamespace(device=device, decode_cuda_graph_runner=runner)
    worker = SimpleNamespace(
        _target_worker=SimpleNamespace(model_runner=model_runner), model_runner=model_runner,
        _config=SimpleNamespace(ragged_eager=policy), _ragged=RaggedVerify(),
    )  # fmt: skip
    line = RaggedStepsMixin._eager_policy(worker)
    assert worker._ragged.graph_bs_limit == limit
    assert ("captured 8" in line) == (limit is not None)


def test_padded_rows_reuse_a_ring_of_buffers_and_zero_the_padding():
    from sglang_spec_ext.sglang.verify.padded_rows import RING, PaddedRows

    rows = PaddedRows()
    keep = torch.tensor([0, 2, 5])
    outs = []
    for step in range(RING + 1):
        full = rows.scatter(torch.full((3, 4), float(step + 1)), keep, 6)
        assert full[keep].eq(step + 1).all() and full[[1, 3, 4]].eq(0).all()
        outs.append(full)
    # RING steps in a row never share a buffer (a step's rows stay while the next ones
    # are verified); then the ring comes round, with no new allocation.
    assert len({t.data_ptr() for t in outs[:RING]}) == RING
    assert outs[RING].data_ptr() == outs[0].data_ptr()
    assert outs[1][keep].eq(2).all()  # untouched by the later steps
    smaller = rows.scatter(torch.ones(1, 4), torch.tensor([1]), 2)  # a smaller batch: a view
    assert smaller.shape == (2, 4) and smaller[0].eq(0).all() and smaller[1].eq(1).all()
    fresh = rows.scatter(torch.ones(1, 4), torch.tensor([0]), 2, reuse=False)
    assert fresh.data_ptr() not in {t.data_ptr() for t in outs}
