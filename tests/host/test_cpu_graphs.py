"""The CUDA-graph emulation of the CPU test bed (sglang/cpu/graphs.py).

What a replay of a captured graph must and must not do, checked on small callables
built like the host's captured forwards: static input buffers and a KV pool closed
over, outputs returned as tensors / dataclasses.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import pytest
import torch

from sglang_spec_ext.sglang.cpu import graph_capture
from sglang_spec_ext.sglang.cpu import graphs as cpu_graphs
from sglang_spec_ext.sglang.cpu.graph_capture import GraphCaptureError, TracedGraph
from sglang_spec_ext.sglang.cpu.graphs import (
    make_cpu_traced_graph_backend,
    resolve_decode_backend_hook,
)


class TinyForward(torch.nn.Module):
    """A decode step shaped like the host's: reads ids/positions from static buffers,
    stores K into a closed-over pool at ``out_cache_loc``, attends over gathered rows."""

    def __init__(self, vocab: int = 32, dim: int = 8, bs: int = 4, pool: int = 64) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Parameter(torch.randn(vocab, dim, generator=g), requires_grad=False)
        self.proj = torch.nn.Linear(dim, dim)
        self.head = torch.nn.Linear(dim, vocab)
        self.input_ids = torch.zeros(bs, dtype=torch.long)
        self.out_cache_loc = torch.zeros(bs, dtype=torch.long)
        self.kv_pool = torch.zeros(pool, dim)
        self.calls = 0

    def forward(self) -> torch.Tensor:
        self.calls += 1  # a Python side effect inside the captured region
        h = self.emb[self.input_ids]
        k = self.proj(h)
        self.kv_pool[self.out_cache_loc] = k  # KV-cache store, in place
        ctx = torch.softmax(k @ self.kv_pool.T, dim=-1) @ self.kv_pool
        return self.head(h + ctx)

    def load(self, ids: list[int], locs: list[int]) -> None:
        """Copy new values into the static buffers, as a runner's load_batch does."""
        self.input_ids.copy_(torch.tensor(ids))
        self.out_cache_loc.copy_(torch.tensor(locs))


@pytest.fixture
def model() -> TinyForward:
    torch.manual_seed(0)
    return TinyForward().eval()


def _eager_on_copy(model: TinyForward, ids: list[int], locs: list[int]) -> torch.Tensor:
    """Eager result for the same inputs on a copy of the pool (the original untouched)."""
    saved = model.kv_pool.clone()
    model.load(ids, locs)
    out = model().clone()
    model.calls -= 1
    model.kv_pool.copy_(saved)
    return out


@torch.inference_mode()
def test_replay_equals_eager_on_new_inputs(model):
    model.load([1, 2, 3, 4], [0, 1, 2, 3])
    graph = TracedGraph("bs4")
    static_out = graph.capture(model)
    assert graph.captured and graph.num_ops() > 5

    for step, (ids, locs) in enumerate(
        [
            ([5, 6, 7, 8], [4, 5, 6, 7]),
            ([9, 1, 9, 1], [8, 9, 10, 11]),
            ([0, 0, 3, 3], [12, 13, 14, 15]),
        ]
    ):
        expected = _eager_on_copy(model, ids, locs)
        model.load(ids, locs)
        out = graph.replay()
        assert out is static_out, "replay must refresh the captured output object in place"
        torch.testing.assert_close(out, expected)
        assert graph.replay_count == step + 1


@torch.inference_mode()
def test_python_side_effect_runs_once_at_capture_never_on_replay(model):
    model.load([1, 2, 3, 4], [0, 1, 2, 3])
    wrapper_runs = []
    original_forward = model.proj.forward

    def wrapped(x: torch.Tensor) -> torch.Tensor:  # a wrapper installed on a module's forward
        wrapper_runs.append(1)
        return original_forward(x)

    model.proj.forward = wrapped
    graph = TracedGraph()
    graph.capture(model)
    assert model.calls == 1 and len(wrapper_runs) == 1
    for _ in range(5):
        graph.replay()
    assert model.calls == 1, "Python inside the captured region re-ran on replay"
    assert len(wrapper_runs) == 1, "a forward wrapper re-ran on replay"


@torch.inference_mode()
def test_value_dependent_branch_is_frozen_at_capture():
    """The hazard a real CUDA graph has: a branch on a value read back into Python is
    taken once, at capture; a replay with values that would go the other way still
    runs the captured side. The emulation must show it (not quietly re-decide)."""
    x = torch.tensor([1.0, 2.0, 3.0])

    def fn() -> torch.Tensor:
        if x.sum().item() > 0:
            return x * 10
        return x - 100

    graph = TracedGraph()
    graph.capture(fn)
    x.copy_(torch.tensor([-1.0, -2.0, -3.0]))
    eager = fn()
    replayed = graph.replay().clone()
    torch.testing.assert_close(eager, torch.tensor([-101.0, -102.0, -103.0]))
    torch.testing.assert_close(replayed, torch.tensor([-10.0, -20.0, -30.0]))


@torch.inference_mode()
def test_in_place_writes_to_closed_over_buffers_repeat_at_each_replay(model):
    counter = torch.zeros((), dtype=torch.long)
    model.load([1, 2, 3, 4], [0, 1, 2, 3])

    def fn() -> torch.Tensor:
        counter.add_(1)
        return model()

    graph = TracedGraph()
    graph.capture(fn)
    assert int(counter) == 1
    written = model.kv_pool[:4].clone()
    assert written.abs().sum() > 0

    model.load([5, 6, 7, 8], [20, 21, 22, 23])
    graph.replay()
    assert int(counter) == 2
    # The store went to the new locations, on the very pool object the callable closed over.
    expected_k = model.proj(model.emb[torch.tensor([5, 6, 7, 8])])
    torch.testing.assert_close(model.kv_pool[20:24], expected_k)
    torch.testing.assert_close(model.kv_pool[:4], written)
    graph.replay()
    assert int(counter) == 3


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    hidden: torch.Tensor | None
    note: str


@torch.inference_mode()
def test_dataclass_outputs_and_aliased_buffers_are_refreshed():
    x = torch.zeros(2, 3)
    out_buf = torch.zeros(2, 3)

    def fn() -> _Out:
        out_buf.copy_(x * 2)  # an output that is a static buffer itself
        return _Out(logits=x + 1, hidden=out_buf, note="captured")

    graph = TracedGraph()
    out = graph.capture(fn)
    x.copy_(torch.ones(2, 3))
    again = graph.replay()
    assert again is out and again.note == "captured"
    torch.testing.assert_close(out.logits, torch.full((2, 3), 2.0))
    torch.testing.assert_close(out.hidden, torch.full((2, 3), 2.0))
    assert out.hidden is out_buf


def test_graph_state_errors():
    graph = TracedGraph("g")
    with pytest.raises(GraphCaptureError):
        graph.replay()
    t = torch.zeros(1)
    graph.capture(lambda: t + 1)
    with pytest.raises(GraphCaptureError):
        graph.capture(lambda: t + 1)
    graph.reset()
    assert not graph.captured


@torch.inference_mode()
def test_backend_warms_up_captures_per_key_and_replays(model):
    backend = make_cpu_traced_graph_backend(None)
    from sglang.srt.model_executor.runner_backend.base_cuda_graph_backend import (
        BaseCudaGraphBackend,
    )

    assert isinstance(backend, BaseCudaGraphBackend)
    hooks = []
    model.load([1, 2, 3, 4], [0, 1, 2, 3])
    with backend.capture_session(None):
        backend.capture_one(("bs", 4), model, post_warmup_hook=lambda: hooks.append(1))
    assert model.calls == backend.WARMUPS + 1 and len(hooks) == backend.WARMUPS
    assert backend.can_run(None, ("bs", 4)) and not backend.can_run(None, ("bs", 8))

    expected = _eager_on_copy(model, [3, 3, 2, 2], [30, 31, 32, 33])
    model.load([3, 3, 2, 2], [30, 31, 32, 33])
    with backend.replay_session():
        out = backend.replay(("bs", 4), None)
    torch.testing.assert_close(out, expected)
    assert model.calls == backend.WARMUPS + 1
    backend.cleanup()
    assert not backend.can_run(None, ("bs", 4))


class _FakeRunner:
    def __init__(self, device: str) -> None:
        self.model_runner = type("MR", (), {"device": device})()


def test_resolve_hook_only_on_cpu_with_switch(monkeypatch):
    sentinel = object()

    def original(runner, *a, **kw):
        return sentinel

    monkeypatch.delenv(graph_capture.ENV, raising=False)
    assert resolve_decode_backend_hook(original, _FakeRunner("cpu")) is sentinel
    monkeypatch.setenv(graph_capture.ENV, "1")
    assert resolve_decode_backend_hook(original, _FakeRunner("cuda")) is sentinel
    backend = resolve_decode_backend_hook(original, _FakeRunner("cpu"))
    assert type(backend).__name__ == "CpuTracedGraphBackend"
    monkeypatch.setenv(graph_capture.ENV, "0")
    assert resolve_decode_backend_hook(original, _FakeRunner("cpu")) is sentinel


def test_install_is_inert_without_switch(monkeypatch):
    monkeypatch.delenv(graph_capture.ENV, raising=False)
    assert cpu_graphs.install_cpu_graphs() == []


def test_hooked_host_targets_exist():
    """Fails loudly when a new host version moves what the emulation hooks."""
    module_path, attr = cpu_graphs.RESOLVE_DECODE_BACKEND_TARGET.rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module_path), attr))
    from sglang.srt.model_executor.runner_backend.base_cuda_graph_backend import (
        BaseCudaGraphBackend,
    )

    abstract = set(BaseCudaGraphBackend.__abstractmethods__)
    assert abstract <= set(dir(cpu_graphs._BackendMixin)), abstract
    assert callable(pkgutil.resolve_name(cpu_graphs.ALIAS_RESOLVER))


# ---------------------------------------------------------------------------
# Graph-safe decode attention (sglang/cpu/masked_attention.py)
# ---------------------------------------------------------------------------


def _attention_case(seed: int = 0, bs: int = 3, width: int = 12, heads: int = 4, kv_heads: int = 2):
    g = torch.Generator().manual_seed(seed)
    dim, pool = 8, 64
    k_cache = torch.randn(pool, kv_heads, dim, generator=g)
    v_cache = torch.randn(pool, kv_heads, dim, generator=g)
    req_to_token = torch.randperm(pool, generator=g)[: 4 * width].view(4, width).clone()
    query = torch.randn(bs, heads, dim, generator=g)
    return query, k_cache, v_cache, req_to_token


def _host_loop(query, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    out = torch.empty_like(query)
    return TorchNativeAttnBackend._run_sdpa_forward_decode(
        None,
        query,
        out,
        k_cache,
        v_cache,
        req_to_token,
        req_pool_indices,
        seq_lens,
        scaling=0.5,
        enable_gqa=query.shape[1] != k_cache.shape[1],
    )


@torch.inference_mode()
def test_masked_decode_attention_matches_host_loop():
    from sglang_spec_ext.sglang.cpu.masked_attention import masked_decode_attention

    query, k_cache, v_cache, req_to_token = _attention_case()
    for idx, lens in (([2, 0, 3], [5, 12, 1]), ([1, 1, 2], [7, 3, 9])):
        idx_t, lens_t = torch.tensor(idx), torch.tensor(lens)
        got = masked_decode_attention(
            query, k_cache, v_cache, req_to_token, idx_t, lens_t, 0.5, True
        )
        want = _host_loop(query, k_cache, v_cache, req_to_token, idx_t, lens_t)
        torch.testing.assert_close(got, want)


@torch.inference_mode()
def test_masked_attention_replays_right_where_the_host_loop_freezes_lengths():
    """Why the plugin needs its own decode attention under graphs: the host's loop
    slices by lengths read at capture, so its replay attends over stale lengths; the
    masked version reads them from the static buffer at every replay."""
    from sglang_spec_ext.sglang.cpu.masked_attention import masked_decode_attention

    query, k_cache, v_cache, req_to_token = _attention_case(seed=1)
    idx, lens = torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])
    masked = TracedGraph()
    masked.capture(
        lambda: masked_decode_attention(query, k_cache, v_cache, req_to_token, idx, lens, 0.5, True)
    )
    looped = TracedGraph()
    looped.capture(lambda: _host_loop(query, k_cache, v_cache, req_to_token, idx, lens))

    idx.copy_(torch.tensor([3, 0, 1]))
    lens.copy_(torch.tensor([10, 2, 7]))
    want = _host_loop(query, k_cache, v_cache, req_to_token, idx, lens)
    torch.testing.assert_close(masked.replay(), want)
    assert not torch.allclose(looped.replay(), want), "the host loop should be frozen at capture"


def test_device_module_reports_capture_state():
    from sglang_spec_ext.sglang.cpu.graph_capture import CpuGraphDeviceModule

    module = CpuGraphDeviceModule()
    seen = []
    t = torch.zeros(1)

    def fn() -> torch.Tensor:
        seen.append(module.is_current_stream_capturing())
        return t + 1

    fn()
    TracedGraph().capture(fn)
    assert seen == [False, True] and not module.is_current_stream_capturing()
    event = module.Event()
    event.record()
    assert event.query() and module.device_count() >= 0


# ---------------------------------------------------------------------------
# Argument resolution under the switch (real host pipeline)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from sglang_spec_ext.models.testing.llama import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0))


def _decode_backend(model_dir: str, *extra: str) -> str:
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.plugins.hook_registry import HookType
    from sglang.srt.server_args import prepare_server_args

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once(
        [(cpu_graphs.ATTENTION_COMPAT_TARGET, cpu_graphs.keep_decode_graphs_hook, HookType.AROUND)]
    )
    sa = prepare_server_args(
        [
            "--model-path",
            model_dir,
            "--device",
            "cpu",
            "--attention-backend",
            "torch_native",
            *extra,
        ]
    )
    sa.resolve_once()
    view = resolved_view(sa)
    assert view.cuda_graph_config.prefill.backend == "disabled"
    return view.cuda_graph_config.decode.backend


def test_switch_keeps_decode_graphs_on_in_argument_resolution(tiny_dir, monkeypatch):
    monkeypatch.delenv(graph_capture.ENV, raising=False)
    assert _decode_backend(tiny_dir) == "disabled"  # switch off: the host's resolution
    monkeypatch.setenv(graph_capture.ENV, "1")
    assert _decode_backend(tiny_dir) == "full"
    assert _decode_backend(tiny_dir, "--disable-cuda-graph") == "disabled"
    assert _decode_backend(tiny_dir, "--cuda-graph-backend-decode", "disabled") == "disabled"


def test_switch_covers_the_target_verify_of_tested_algorithms(tiny_dir, monkeypatch):
    monkeypatch.setenv(graph_capture.ENV, "1")
    assert _decode_backend(tiny_dir, "--speculative-algorithm", "NGRAM") == "full"
    draft = ("--speculative-draft-model-path", tiny_dir)
    assert _decode_backend(tiny_dir, "--speculative-algorithm", "STANDALONE", *draft) == "full"
    monkeypatch.delenv(graph_capture.ENV)
    assert _decode_backend(tiny_dir, "--speculative-algorithm", "NGRAM") == "disabled"
    assert _decode_backend(tiny_dir, "--speculative-algorithm", "STANDALONE", *draft) == "disabled"


def test_nextn_mtp_servers_get_the_graphs_of_eagle(tmp_path_factory, monkeypatch):
    """NEXTN is still spelled NEXTN when the attention hook runs (the host resolves the
    alias to EAGLE later): MTP servers keep decode graphs on like EAGLE ones."""
    from sglang_spec_ext.models.testing.mtp import build_tiny_mimo_mtp

    mimo = str(build_tiny_mimo_mtp(tmp_path_factory.mktemp("mimo") / "m", seed=0))
    steps = ("--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "2")  # fmt: skip
    monkeypatch.setenv(graph_capture.ENV, "1")
    for algo in ("NEXTN", "nextn", "EAGLE"):
        assert _decode_backend(mimo, "--speculative-algorithm", algo, *steps) == "full", algo
    path = ("--speculative-draft-model-path", mimo)
    assert _decode_backend(mimo, "--speculative-algorithm", "NEXTN", *path, *steps) == "full"

    def view(algo):
        fields = {"speculative_algorithm": algo, "speculative_draft_model_path": None,
                  "trust_remote_code": False}  # fmt: skip
        return type("V", (), fields)()

    names = {a: cpu_graphs.resolved_algorithm_name(view(a)) for a in ("NEXTN", "eagle", "suffix")}
    assert names == {"NEXTN": "EAGLE", "eagle": "EAGLE", "suffix": "SUFFIX"}
    assert cpu_graphs.resolved_algorithm_name(view(None)) == ""


def test_untested_algorithms_keep_graphs_off(monkeypatch):
    """An algorithm outside the tested list resolves as without the switch."""
    monkeypatch.setenv(graph_capture.ENV, "1")
    assert "DFLASH" not in cpu_graphs.GRAPH_SPEC_ALGORITHMS
    view = type(
        "V",
        (),
        {"device": "cpu", "attention_backend": "torch_native", "speculative_algorithm": "DFLASH"},
    )()
    declared = []
    monkeypatch.setattr("sglang.srt.arg_groups.overrides.resolving_view", lambda server_args: view)
    monkeypatch.setattr(
        "sglang.srt.arg_groups.overrides.declare_resolution",
        lambda *a, **kw: declared.append(kw),
    )
    assert cpu_graphs.keep_decode_graphs_hook(lambda sa: "host", object()) == "host"
    assert declared == []


# ---------------------------------------------------------------------------
# Graph-safe target verify
# ---------------------------------------------------------------------------


def _verify_case(seed: int, bs: int = 3, n: int = 4):
    g = torch.Generator().manual_seed(seed)
    query, k_cache, v_cache, req_to_token = _attention_case(seed, bs=bs * n)
    visible = (torch.rand(bs, n, n, generator=g) > 0.5).tril() | torch.eye(n, dtype=torch.bool)
    draft_slots = torch.randperm(k_cache.shape[0], generator=g)[: bs * n].view(bs, n)
    return query, k_cache, v_cache, req_to_token, visible, draft_slots


@torch.inference_mode()
def test_masked_verify_attention_matches_the_cpu_fallback():
    from sglang_spec_ext.sglang.cpu.fallbacks.verify_attention import tree_verify_attention
    from sglang_spec_ext.sglang.cpu.masked_attention import masked_verify_attention

    query, k_cache, v_cache, req_to_token, visible, draft_slots = _verify_case(2)
    idx, lens = torch.tensor([3, 0, 2]), torch.tensor([5, 12, 0])
    got = masked_verify_attention(
        query, k_cache, v_cache, req_to_token, idx, lens, draft_slots, visible, 0.5, True
    )
    prefix = [req_to_token[int(r), : int(s)] for r, s in zip(idx, lens, strict=True)]
    want = tree_verify_attention(query, k_cache, v_cache, prefix, draft_slots, visible, scaling=0.5)
    torch.testing.assert_close(got, want)


@torch.inference_mode()
def test_verify_mask_staging_and_replay_follow_new_masks():
    from sglang_spec_ext.sglang.cpu.masked_attention import (
        masked_verify_attention,
        stage_verify_mask,
    )

    query, k_cache, v_cache, req_to_token, visible, draft_slots = _verify_case(3)
    bs, n = draft_slots.shape
    mask_buf = torch.zeros(4, n, n, dtype=torch.bool)  # max_bs 4, batch of 3: one pad row
    stage_verify_mask(mask_buf, None)
    assert torch.equal(mask_buf[0], torch.ones(n, n, dtype=torch.bool).tril())
    idx, lens = torch.tensor([0, 1, 2]), torch.tensor([2, 3, 4])
    graph = TracedGraph()
    graph.capture(
        lambda: masked_verify_attention(
            query, k_cache, v_cache, req_to_token, idx, lens, draft_slots, mask_buf[:bs], 0.5, True
        )
    )
    stage_verify_mask(mask_buf, visible.reshape(-1).to(torch.uint8))  # the QLEN_ONLY layout
    assert torch.equal(mask_buf[:bs], visible)
    assert torch.equal(mask_buf[bs], torch.ones(n, n, dtype=torch.bool).tril())
    lens.copy_(torch.tensor([9, 1, 6]))
    want = masked_verify_attention(
        query, k_cache, v_cache, req_to_token, idx, lens, draft_slots, visible, 0.5, True
    )
    torch.testing.assert_close(graph.replay(), want)
    with pytest.raises(ValueError, match="layout"):
        stage_verify_mask(mask_buf, torch.ones(n * n + 1, dtype=torch.bool))


def test_graph_mode_hook_replays_verify_only_with_switch(monkeypatch):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    def host(mode):
        return mode.is_cpu_graph()

    monkeypatch.delenv(graph_capture.ENV, raising=False)
    assert not cpu_graphs.graph_mode_hook(host, ForwardMode.TARGET_VERIFY)
    assert cpu_graphs.graph_mode_hook(host, ForwardMode.DECODE)
    monkeypatch.setenv(graph_capture.ENV, "1")
    assert cpu_graphs.graph_mode_hook(host, ForwardMode.TARGET_VERIFY)
    assert not cpu_graphs.graph_mode_hook(host, ForwardMode.EXTEND)


def test_verify_forward_takes_the_graph_path_only_while_capturing():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_spec_ext.sglang.cpu.graph_attention import forward_hook

    eager = object()
    fb = type("FB", (), {"forward_mode": ForwardMode.TARGET_VERIFY, "encoder_lens": None})()
    layer = type("L", (), {"is_cross_attention": False, "sliding_window_size": -1})()
    backend = type("B", (), {"use_sliding_window_kv_pool": False})()
    taken = []

    def original(*a, **kw):
        taken.append("eager")
        return eager

    assert forward_hook(original, backend, None, None, None, layer, fb) is eager
    assert taken == ["eager"]


# ---------------------------------------------------------------------------
# The model draft's own graphs (sglang/cpu/draft_graphs.py, draft_attention.py)
# ---------------------------------------------------------------------------


def _host_extend_loop(query, k_cache, v_cache, req_to_token, idx, seq_lens, n):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    out = torch.empty_like(query)
    return TorchNativeAttnBackend._run_sdpa_forward_extend(
        None,
        query,
        out,
        k_cache,
        v_cache,
        req_to_token,
        idx,
        seq_lens,
        seq_lens - n,
        torch.full_like(seq_lens, n),
        scaling=0.5,
        enable_gqa=query.shape[1] != k_cache.shape[1],
        causal=True,
    )


@torch.inference_mode()
def test_masked_extend_attention_matches_host_loop_and_replays_new_lengths():
    """The draft extend (n tokens per request, causal over the request's KV) computed
    densely with a mask equals the host's per-request loop, and a captured one follows
    new lengths and pool rows at replay."""
    from sglang_spec_ext.sglang.cpu.masked_attention import masked_extend_attention

    _, k_cache, v_cache, req_to_token = _attention_case(seed=2)
    n = 3
    g = torch.Generator().manual_seed(5)
    query = torch.randn(3 * n, 4, 8, generator=g)
    idx, lens = torch.tensor([2, 0, 3]), torch.tensor([5, 12, 3])

    def masked():
        return masked_extend_attention(query, k_cache, v_cache, req_to_token, idx, lens, 0.5, True)

    torch.testing.assert_close(
        masked(), _host_extend_loop(query, k_cache, v_cache, req_to_token, idx, lens, n)
    )
    graph = TracedGraph()
    graph.capture(masked)
    idx.copy_(torch.tensor([1, 3, 2]))
    lens.copy_(torch.tensor([9, 4, 11]))
    torch.testing.assert_close(
        graph.replay(), _host_extend_loop(query, k_cache, v_cache, req_to_token, idx, lens, n)
    )


def test_compiled_function_inside_a_capture_is_recorded():
    """The host torch.compile's a draft helper (_select_top_k_tokens_later); a capture
    records its body (as a GPU capture records its kernels) and replays it on new inputs."""
    x = torch.zeros(4)

    @torch.compile(dynamic=True)
    def helper(t):
        return t * 2 + 1

    graph = TracedGraph()
    out = graph.capture(lambda: helper(x))
    torch.testing.assert_close(out, torch.ones(4))
    x.copy_(torch.arange(4.0))
    torch.testing.assert_close(graph.replay(), torch.arange(4.0) * 2 + 1)


@torch.inference_mode()
def test_graph_safe_multi_step_draft_replays_new_lengths():
    """The torch_native multi-step draft backend in its graph-safe form, captured the way
    the host's draft runner captures it (metadata in the graph, then a step's attention),
    replays with the lengths and pool rows copied in later."""
    from types import SimpleNamespace

    from sglang_spec_ext.sglang.cpu.draft_attention import TorchNativeMultiStepDraftBackend

    g = torch.Generator().manual_seed(3)
    heads, kv_heads, dim, slots = 4, 2, 8, 256
    req_to_token = torch.randperm(slots, generator=g)[:200].view(4, 50).to(torch.int32)
    k_pool = torch.randn(slots, kv_heads, dim, generator=g)
    v_pool = torch.randn(slots, kv_heads, dim, generator=g)
    pool = SimpleNamespace(
        req_to_token=req_to_token,
        get_key_buffer=lambda _i: k_pool,
        get_value_buffer=lambda _i: v_pool,
    )
    runner = SimpleNamespace(device="cpu", req_to_token_pool=pool, token_to_kv_pool=pool)
    topk, steps = 2, 3
    layer = SimpleNamespace(tp_q_head_num=heads, tp_k_head_num=kv_heads, qk_head_dim=dim,
                            v_head_dim=dim, layer_id=0, scaling=dim**-0.5,
                            is_cross_attention=False, sliding_window_size=-1)  # fmt: skip
    q = torch.randn(2 * topk, heads * dim, generator=g)
    batch = SimpleNamespace(req_pool_indices=torch.tensor([2, 0]), seq_lens=torch.tensor([7, 12]),
                            out_cache_loc=None, encoder_lens=None)  # fmt: skip

    def draft_step(backend, step):
        backend.init_forward_metadata_in_graph(batch)
        return backend.attn_backends[step].forward_decode(
            q, None, None, layer, batch, save_kv_cache=False
        )

    captured = TorchNativeMultiStepDraftBackend(runner, topk, steps, graph_safe=True)
    graph = TracedGraph()
    graph.capture(lambda: draft_step(captured, 1))
    batch.req_pool_indices.copy_(torch.tensor([1, 3]))
    batch.seq_lens.copy_(torch.tensor([20, 4]))
    eager = TorchNativeMultiStepDraftBackend(runner, topk, steps)  # the host loop
    eager.init_forward_metadata(batch)
    want = eager.attn_backends[1].forward_decode(q, None, None, layer, batch, save_kv_cache=False)
    torch.testing.assert_close(graph.replay(), want)
    with pytest.raises(RuntimeError, match="graph-safe"):
        eager.init_forward_metadata_in_graph(batch)


def test_draft_graph_runners_only_with_the_switch_on_cpu(monkeypatch):
    """Without the switch (or off the CPU engine) the hook returns what the host built and
    adds nothing; the hooked host target exists."""
    from types import SimpleNamespace

    from sglang_spec_ext.sglang.cpu import draft_graphs as cpu_draft_graphs

    module_path, cls_name, attr = cpu_draft_graphs.CAPTURE_DRAFT_GRAPHS_TARGET.rsplit(".", 2)
    assert callable(getattr(getattr(importlib.import_module(module_path), cls_name), attr))

    def host(worker):
        worker.cuda_graph_runner = None
        worker.cuda_graph_runner_for_draft_extend = None
        return "host"

    for env, device in (("", "cpu"), ("1", "cuda")):
        monkeypatch.setenv(graph_capture.ENV, env)
        worker = SimpleNamespace(device=device, speculative_num_steps=3)
        assert cpu_draft_graphs.capture_draft_graphs_hook(host, worker) == "host"
        assert worker.cuda_graph_runner is None
        assert worker.cuda_graph_runner_for_draft_extend is None
