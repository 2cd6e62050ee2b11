"""Token-bucket verify graphs for ragged verify (sglang/verify/ragged_graphs.py) and the
CPU engine's graph-safe ragged tree verify (sglang/cpu/ragged_attention.py).

The attention is checked against the eager CPU fallback (``tree_verify_attention`` with
per-request lengths), captured with the emulation's ``TracedGraph`` and replayed after
the layout's tensors were restaged in place the way the host's runner stages them
(``RaggedVerifyLayout.padded_to_bucket``, the host's own code). The hooks run against the
host's real gate, spec-info builder and layout; the graph runner they read is a stand-in
(the real one is built by a server: tests/e2e/test_ragged_verify.py serves it).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from sglang_spec_ext.sglang.cpu.fallbacks.verify_attention import tree_verify_attention
from sglang_spec_ext.sglang.cpu.graph_capture import TracedGraph
from sglang_spec_ext.sglang.cpu.ragged_attention import (
    masked_ragged_verify_attention,
    stage_ragged_mask,
)
from sglang_spec_ext.sglang.verify import ragged_graphs

WIDTH, MAX_BS, POOL, PREFIX = 4, 4, 96, 10


def _case(seed: int):
    g = torch.Generator().manual_seed(seed)
    heads, kv_heads, dim = 4, 2, 8
    k_cache = torch.randn(POOL, kv_heads, dim, generator=g)
    v_cache = torch.randn(POOL, kv_heads, dim, generator=g)
    req_to_token = torch.randperm(POOL, generator=g)[: MAX_BS * PREFIX].view(MAX_BS, PREFIX)
    visible = (torch.rand(MAX_BS, WIDTH, WIDTH, generator=g) > 0.4).tril()
    visible |= torch.eye(WIDTH, dtype=torch.bool)
    return g, heads, dim, k_cache, v_cache, req_to_token, visible


def _layout(lens: list[int], grid: list[int]):
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    return RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=lens, device="cpu", grid=grid)


def _eager(query, k_cache, v_cache, req_to_token, idx, seq_lens, cache_loc, visible, lens):
    total = sum(lens)
    prefix = [req_to_token[int(r), : int(s)] for r, s in zip(idx, seq_lens, strict=True)]
    return tree_verify_attention(
        query[:total], k_cache, v_cache, prefix, cache_loc[:total], visible[: len(lens)],
        scaling=0.5, lens=lens,
    )  # fmt: skip


@torch.inference_mode()
def test_ragged_graph_replays_new_layouts_like_the_eager_fallback():
    g, heads, dim, k_cache, v_cache, req_to_token, visible = _case(0)
    grid = [WIDTH * b for b in (1, 2, 4)]  # the runner's buckets: bs x width
    bucket = 8  # captured with min(8, MAX_BS) = 4 slots, as the host captures
    query = torch.randn(bucket, heads, dim, generator=g)
    cache_loc = torch.randperm(POOL, generator=g)[:bucket]
    idx = torch.tensor([2, 0, 3, 1])
    seq_lens = torch.tensor([PREFIX, 3, 7, 1])
    captured = _layout([2, 2, 2, 2], grid)  # the host's capture layout of 8 tokens
    mask = torch.zeros(MAX_BS, WIDTH, WIDTH, dtype=torch.bool)
    stage_ragged_mask(mask, None, WIDTH)
    graph = TracedGraph("bucket8")
    graph.capture(
        lambda: masked_ragged_verify_attention(
            query, k_cache, v_cache, req_to_token, idx, seq_lens, cache_loc,
            captured.verify_lens, captured.qo_indptr_device, mask, 0.5, True,
        )
    )  # fmt: skip
    for lens in ([3, 1, 2], [1, 4, 1, 1], [4, 4], [1, 2, 1, 1]):
        live = _layout(lens, grid)
        assert live.graph_num_tokens == bucket
        # what the host's runner does before a replay (_stage_ragged_verify_layout)
        padded = live.padded_to_bucket(padded_bs=MAX_BS, cap=WIDTH)
        captured.verify_lens.copy_(padded.verify_lens)
        captured.qo_indptr_device.copy_(padded.qo_indptr_device)
        stage_ragged_mask(mask, visible[: len(lens)].reshape(-1).to(torch.uint8), WIDTH)
        got = graph.replay()
        want = _eager(query, k_cache, v_cache, req_to_token, idx, seq_lens, cache_loc, visible,
                      lens)  # fmt: skip
        total = sum(lens)
        torch.testing.assert_close(got[:total], want)
        # the bucket's leftover: a padding slot's rows or rows of no slot, never NaN
        assert torch.isfinite(got[total:]).all()


@torch.inference_mode()
def test_a_narrower_live_width_stages_into_the_corner():
    mask = torch.zeros(3, WIDTH, WIDTH, dtype=torch.bool)
    live = torch.tensor([[1, 0], [1, 1]], dtype=torch.uint8).repeat(2, 1)  # 2 requests, n=2
    stage_ragged_mask(mask, live.reshape(-1), 2)
    causal = torch.ones(WIDTH, WIDTH, dtype=torch.bool).tril()
    for b in range(2):
        assert torch.equal(mask[b, :2, :2], torch.tensor([[True, False], [True, True]]))
        assert torch.equal(mask[b, 2:], causal[2:])
    assert torch.equal(mask[2], causal)
    with pytest.raises(ValueError, match="exceeds the captured width"):
        stage_ragged_mask(mask, None, WIDTH + 1)
    with pytest.raises(ValueError, match="per-request 2x2 layout"):
        stage_ragged_mask(mask, torch.ones(7, dtype=torch.uint8), 2)


def _suffix_algo():
    from sglang_spec_ext.sglang.serving.spec_class import ModelFreeSpecAlgo

    return ModelFreeSpecAlgo(name="SUFFIX", factory=lambda sa: object, supports_overlap=True)


def test_compact_gate_is_the_plugin_decision_for_ours_and_the_host_for_the_rest(monkeypatch):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    host_says = []
    original = lambda algo: host_says.append(algo) or "host"  # noqa: E731
    monkeypatch.setattr(ragged_graphs, "ragged_graphs_wanted", lambda: True)
    assert ragged_graphs.compact_graphs_hook(original, _suffix_algo()) is True
    monkeypatch.setattr(ragged_graphs, "ragged_graphs_wanted", lambda: False)
    assert ragged_graphs.compact_graphs_hook(original, _suffix_algo()) is False
    assert not host_says
    assert ragged_graphs.compact_graphs_hook(original, SpeculativeAlgorithm.DSPARK) is True
    assert host_says == [SpeculativeAlgorithm.DSPARK]


def test_the_real_host_gate_follows_the_hook(monkeypatch):
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner as runner_mod

    monkeypatch.delenv("SGLANG_RAGGED_VERIFY_MODE", raising=False)
    algo = _suffix_algo()
    monkeypatch.setattr(ragged_graphs, "ragged_graphs_wanted", lambda: True)
    # The host's own gate (unwrapped: another test in this process may have installed
    # the hook) asks its env var, static by default: off.
    host_gate = inspect.unwrap(runner_mod.ragged_verify_compact_graphs_enabled)
    assert host_gate(algo) is False
    assert ragged_graphs.compact_graphs_hook(host_gate, algo) is True


def _args(**kw):
    base = {"attention_backend": "torch_native", "speculative_num_draft_tokens": 16}
    return SimpleNamespace(**{**base, **kw})


def _gpu(**kw):
    return _args(
        **{"device": "cuda", "speculative_eagle_topk": 1, "disable_cuda_graph": False, **kw}
    )


@pytest.mark.parametrize(
    ("args", "graphs", "env", "want"),
    [
        (_args(), True, {}, True),
        (_args(), False, {}, False),  # no graph emulation: nothing replays
        (_args(), True, {"SGLANG_SPEC_EXT_RAGGED_GRAPHS": "0"}, False),
        (_args(), True, {"SGLANG_SPEC_EXT_RAGGED_VERIFY": "0"}, False),
        (_args(enable_lora=True), True, {}, False),  # the host's compact runner refuses LoRA
        (_args(attention_backend="triton"), True, {}, False),
        (_args(speculative_num_draft_tokens=1), True, {}, False),
        # A GPU: FA3 / trtllm_mha with chain drafts (their ragged verify is causal).
        (_gpu(attention_backend="fa3"), False, {}, True),
        (_gpu(attention_backend="trtllm_mha"), False, {}, True),
        (_gpu(attention_backend="fa3", speculative_eagle_topk=8), False, {}, False),  # trees
        (_gpu(attention_backend="flashinfer"), False, {}, False),  # refuses ragged in graphs
        (_gpu(attention_backend="triton"), False, {}, False),
        (_gpu(attention_backend="fa3", disable_cuda_graph=True), False, {}, False),
        (_gpu(attention_backend="fa3"), False, {"SGLANG_SPEC_EXT_RAGGED_GRAPHS": "0"}, False),
        (_gpu(attention_backend="fa3", device="cpu"), False, {}, False),
    ],
)
def test_ragged_graphs_wanted(monkeypatch, args, graphs, env, want):
    from sglang_spec_ext.sglang.cpu import graphs as cpu_graphs

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(cpu_graphs, "cpu_graphs_enabled", lambda: graphs)
    assert ragged_graphs.ragged_graphs_wanted(args) is want


def test_capture_spec_info_gets_the_runners_capture_layout():
    algo = _suffix_algo()
    made = []
    runner = SimpleNamespace(
        ragged_verify_mode=True,
        model_runner=SimpleNamespace(spec_algorithm=algo),
        _capture_ragged_verify_layout=lambda n: made.append(n) or f"layout{n}",
    )
    spec = SimpleNamespace(ragged_verify_layout=None)
    assert ragged_graphs.capture_spec_info_hook(lambda r, n: spec, runner, 24) is spec
    assert spec.ragged_verify_layout == "layout24" and made == [24]
    runner.ragged_verify_mode = False
    other = SimpleNamespace(ragged_verify_layout=None)
    ragged_graphs.capture_spec_info_hook(lambda r, n: other, runner, 24)
    assert other.ragged_verify_layout is None


def test_bucket_layout_rounds_up_and_declines_what_no_graph_holds():
    # A stand-in for the target's DecodeCudaGraphRunner (a real one needs a server).
    runner = SimpleNamespace(ragged_verify_mode=True, capture_num_tokens=[4, 8, 16], max_bs=4)
    worker = SimpleNamespace(model_runner=SimpleNamespace(decode_cuda_graph_runner=runner))
    layout = ragged_graphs.bucket_layout(worker, [3, 1, 2], "cpu")
    assert layout.graph_num_tokens == 8 and layout.verify_lens_cpu == [3, 1, 2]
    assert layout.qo_indptr_device.tolist() == [0, 3, 4, 6]
    assert ragged_graphs.bucket_layout(worker, [1] * 5, "cpu") is None  # more than max_bs
    runner.capture_num_tokens = [4, 8]
    assert ragged_graphs.bucket_layout(worker, [4, 4, 1], "cpu") is None  # past the last bucket
    runner.ragged_verify_mode = False
    assert ragged_graphs.bucket_layout(worker, [3, 1, 2], "cpu") is None
