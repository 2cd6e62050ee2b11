"""The CPU graph emulation on the families beyond dense Llama: sliding-window attention
(``cpu/masked_attention.py`` with a ``window``) and the host's CPU MoE
(``cpu/graph_moe.py``), each against the host's own eager code and under a traced
capture replayed on new inputs (where the host's code freezes what it read at capture).
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_spec_ext.sglang.cpu.graph_capture import TracedGraph
from tests.host.test_cpu_graphs import _attention_case as _kv_case


def _host_decode(query, k_cache, v_cache, req_to_token, idx, lens, window):
    """The host's ``torch_native`` decode loop, with its sliding-window mask."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    backend = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)
    return backend._run_sdpa_forward_decode(
        query, torch.empty_like(query), k_cache, v_cache, req_to_token, idx, lens,
        scaling=0.5, enable_gqa=True, sliding_window_size=window,
    )  # fmt: skip


@pytest.mark.parametrize("window", [0, 2, 5, 30])
@torch.inference_mode()
def test_windowed_decode_matches_the_host_loop(window):
    from sglang_spec_ext.sglang.cpu.masked_attention import masked_decode_attention

    query, k_cache, v_cache, req_to_token = _kv_case(0, bs=3)
    for idx, lens in (([2, 0, 3], [5, 12, 1]), ([1, 1, 2], [7, 3, 9])):
        idx_t, lens_t = torch.tensor(idx), torch.tensor(lens)
        got = masked_decode_attention(
            query, k_cache, v_cache, req_to_token, idx_t, lens_t, 0.5, True, window
        )
        want = _host_decode(query, k_cache, v_cache, req_to_token, idx_t, lens_t, window)
        torch.testing.assert_close(got, want)
    # and no window is not the window: the test can tell them apart
    idx_t, lens_t = torch.tensor([2, 0, 3]), torch.tensor([5, 12, 9])
    unwindowed = masked_decode_attention(
        query, k_cache, v_cache, req_to_token, idx_t, lens_t, 0.5, True
    )
    windowed = _host_decode(query, k_cache, v_cache, req_to_token, idx_t, lens_t, 2)
    assert not torch.allclose(unwindowed, windowed)


@pytest.mark.parametrize("window", [0, 1, 3, 40])
@torch.inference_mode()
def test_windowed_verify_matches_the_cpu_fallback_deeper_than_the_window(window):
    """Tree drafts of depth up to 5 against windows of 0 to 3: the drafts' own first
    tokens fall out of the window, as in the plugin's eager verify attention."""
    from sglang_spec_ext.sglang.cpu.fallbacks.verify_attention import tree_verify_attention
    from sglang_spec_ext.sglang.cpu.masked_attention import masked_verify_attention

    bs, n = 3, 6
    g = torch.Generator().manual_seed(window)
    query, k_cache, v_cache, req_to_token = _kv_case(window, bs=bs * n)
    # a chain 0-1-2-3 and branches 4 (child of 1) and 5 (child of 4): depths 0 1 2 3 2 3
    parents = [-1, 0, 1, 2, 1, 4]
    visible = torch.zeros(n, n, dtype=torch.bool)
    depth = []
    for i, p in enumerate(parents):
        visible[i, i] = True
        if p >= 0:
            visible[i] |= visible[p]
        depth.append(int(visible[i].sum()) - 1)
    visible = visible.expand(bs, n, n).clone()
    draft_slots = torch.randperm(64, generator=g)[: bs * n].view(bs, n)
    idx, lens = torch.tensor([3, 0, 2]), torch.tensor([5, 12, 1])
    positions = (lens.view(-1, 1) + torch.tensor(depth)).reshape(-1)
    got = masked_verify_attention(
        query, k_cache, v_cache, req_to_token, idx, lens, draft_slots, visible, 0.5, True,
        window, positions,
    )  # fmt: skip
    prefix = [req_to_token[int(r), : int(s)] for r, s in zip(idx, lens, strict=True)]
    want = tree_verify_attention(
        query, k_cache, v_cache, prefix, draft_slots, visible, scaling=0.5,
        query_positions=positions, sliding_window=window,
    )  # fmt: skip
    torch.testing.assert_close(got, want)


@torch.inference_mode()
def test_windowed_decode_replays_on_new_lengths():
    from sglang_spec_ext.sglang.cpu.masked_attention import masked_decode_attention

    query, k_cache, v_cache, req_to_token = _kv_case(1, bs=3)
    idx, lens = torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])
    graph = TracedGraph()
    graph.capture(
        lambda: masked_decode_attention(
            query, k_cache, v_cache, req_to_token, idx, lens, 0.5, True, 2
        )
    )
    idx.copy_(torch.tensor([3, 0, 1]))
    lens.copy_(torch.tensor([10, 2, 7]))
    want = _host_decode(query, k_cache, v_cache, req_to_token, idx, lens, 2)
    torch.testing.assert_close(graph.replay(), want)


# ---------------------------------------------------------------------------
# The host's CPU MoE under capture (cpu/graph_moe.py)
# ---------------------------------------------------------------------------


def _moe_case(seed: int, tokens: int = 5, experts: int = 6, top_k: int = 2, bias: bool = False):
    g = torch.Generator().manual_seed(seed)
    hidden, inter = 16, 12
    layer = types.SimpleNamespace(
        num_experts=experts,
        w13_weight=torch.randn(experts, 2 * inter, hidden, generator=g) / 4,
        w2_weight=torch.randn(experts, hidden, inter, generator=g) / 4,
    )
    if bias:
        layer.w13_weight_bias = torch.randn(experts, 2 * inter, generator=g)
        layer.w2_weight_bias = torch.randn(experts, hidden, generator=g)
    x = torch.randn(tokens, hidden, generator=g)
    logits = torch.randn(tokens, experts, generator=g)
    weights, ids = torch.softmax(logits, -1).topk(top_k, dim=-1)
    return layer, x, (weights, ids.to(torch.int32), None)


def _config(activation: str = "silu"):
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig

    return MoeRunnerConfig(activation=activation)


@pytest.mark.parametrize("bias", [False, True])
@torch.inference_mode()
def test_graph_safe_moe_matches_the_host(bias):
    from sglang.srt.layers.moe.fused_moe_native import moe_forward_native

    from sglang_spec_ext.sglang.cpu.graph_moe import moe_forward_graph_safe

    layer, x, topk = _moe_case(0, bias=bias)
    torch.testing.assert_close(
        moe_forward_graph_safe(layer, x, topk, _config()),
        moe_forward_native(layer, x, topk, _config()),
    )


@torch.inference_mode()
def test_captured_moe_routes_each_replay_by_its_own_router():
    """The host's MoE captured into a graph keeps the capture's per-expert counts (a new
    routing gives a wrong answer); the hook's capture routes every replay afresh."""
    from sglang.srt.layers.moe.fused_moe_native import moe_forward_native

    from sglang_spec_ext.sglang.cpu.graph_moe import moe_forward_hook

    layer, x, (weights, ids, _) = _moe_case(1)
    static_x, static_w, static_ids = x.clone(), weights.clone(), ids.clone()

    def step(fn):
        return lambda: fn(layer, static_x, (static_w, static_ids, None), _config())

    hooked, host = TracedGraph(), TracedGraph()
    hooked.capture(step(lambda *a: moe_forward_hook(moe_forward_native, *a)))
    host.capture(step(moe_forward_native))

    _, new_x, (new_w, new_ids, _) = _moe_case(7)
    assert not torch.equal(new_ids, ids)
    static_x.copy_(new_x)
    static_w.copy_(new_w)
    static_ids.copy_(new_ids)
    want = moe_forward_native(layer, new_x, (new_w, new_ids, None), _config())
    torch.testing.assert_close(hooked.replay(), want)
    assert not torch.allclose(host.replay(), want), "the host's loop should be frozen"
