"""Target-verify attention metadata at every adaptive SUFFIX width, per GPU backend.

Adaptive SUFFIX (``SGLANG_SPEC_EXT_ADAPTIVE=1``) verifies a different number of
tokens per request from step to step (1 .. ``--speculative-num-draft-tokens``).
Every target-verify forward builds its attention metadata in the target's attention
backend; this test checks, for each width the controller can choose, that the
metadata the host's REAL backend code builds for our verify input describes that
width: query rows per request, KV lengths, the tree mask (length and content, per
request) and the KV slots read; and that nothing is indexed out of range (on CPU
tensors an out-of-range index raises, where a GPU would read garbage).

How a step runs here: the REAL adaptive worker (``AdaptiveSuffixWorker``: our
drafter, its width switch and the host's ``NGRAMWorker`` code that turns our packed
drafts into the ``NgramVerifyInput``, the full-mask layout a GPU server builds)
runs ``forward_batch_generation`` on a decode batch at a width the test scripts in
place of the controller. The target forward is a stand-in that does what the
host's eager model runner does before the model runs: it builds a real
``ForwardBatch`` (with a real ``KVLocPlan`` over a real ``KVIndexTranslator``) and
calls ``model_runner.attn_backend.init_forward_metadata`` -- the backend the
model runner holds at that moment, so a worker that switches the backend per
width is exercised as the server would run it. The backend is built at the
startup width, as the server builds it, after which the worker gets
``init_cuda_graphs()``, as the scheduler calls it (that is where the worker builds
what it needs per width).

Per backend:

* FA3 (``flashattention_backend.FlashAttentionBackend``): the real class, built
  on CPU (its ``sgl_kernel.flash_attn`` import is a placeholder module; the
  metadata path launches no kernel), real ``init_forward_metadata``. Both of its
  target-verify paths: tree drafts (``speculative_eagle_topk`` > 1: prefix
  metadata plus the per-draft "expand" metadata extracted from the custom mask)
  and chains (topk 1). Page size 16 runs chains only: our server-args hook
  refuses trees with FA3 at page size > 1 (checked below too).
* triton (``triton_backend.TritonAttnBackend``): the real class and its real
  ``init_forward_metadata``; its KV-index gather is a Triton kernel, run by
  Triton's CPU interpreter (``TRITON_INTERPRET=1``, set before the kernels are
  defined, so this part runs in a subprocess).
* flashinfer: the ``flashinfer`` package (CUDA only) is not installed, so the
  backend object cannot be built. The real target-verify path from
  ``FlashInferAttnBackend.init_forward_metadata`` down is run: the prefill
  indices updater (``FlashInferIndicesUpdaterPrefill.update_single_wrapper`` ->
  ``call_begin_forward`` -> ``NgramVerifyInput.generate_attn_arg_prefill`` and the
  translator's Triton gather, interpreted as above); the one STAND-IN is the
  flashinfer wrapper whose ``begin_forward`` (flashinfer's ``plan``, a CUDA call)
  records the arguments it is planned with, which are what is checked.

Also stand-ins, because they need the GPU: the host's tree-index reconstruction
and extend-cache-location kernels (our pure-torch CPU fallbacks of the same ops),
the target model (returns logits of the right shape; the test checks metadata, not
tokens), the tree verify (accepts the root only) and the KV moves / mamba hooks
(no-ops). FA3 and triton backends, the startup one and any the worker builds, come
from the host's own factory (``ModelRunner._get_attention_backend`` -> the attention
registry, for the published ``--attention-backend``), called on a stand-in model
runner that holds the fields the backends read; the registry's device query answers
SM 9.0 (an H100), where the host's FA3 entry asserts a Hopper or Ampere GPU.

What only a GPU can check: the kernels consuming this metadata (FA3's
``flash_attn_with_kvcache``, flashinfer's plan/run, the triton extend kernel), CUDA
graph capture and replay at the startup width, and that widths other than the
startup width (which run eagerly) give the same tokens as the startup width.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import torch

MAX_WIDTH = 6
CONTEXT = 128
POOL_ROWS = 6
#: Prompt + output per request: repetitive, with branches, so the drafter proposes trees.
REQUESTS = {
    "a": ([9, 5, 1, 9, 5, 2, 9, 5, 3, 9], [5]),
    "b": ([7, 8, 9, 7, 8, 6, 7, 8, 9, 7, 8, 6, 7, 8, 9, 7, 8, 6, 7], [8, 9]),
    "c": ([8, 1, 2, 8, 1, 3, 8, 1, 2, 8, 1, 3, 8], [1]),
}
POOL_INDEX = {"a": 3, "b": 1, "c": 4}


# -- the host pieces around the metadata ---------------------------------------------
def _slot(row: int, col: int, page_size: int) -> int:
    """KV slot of (request row, position): each row owns whole pages, rows interleaved."""
    pages_per_row = CONTEXT // page_size
    page = 1 + (col // page_size) * POOL_ROWS + row  # page 0 is the host's padding page
    assert col // page_size < pages_per_row
    return page * page_size + col % page_size


def req_to_token(page_size: int) -> torch.Tensor:
    table = torch.zeros((POOL_ROWS, CONTEXT), dtype=torch.int32)
    for row in range(POOL_ROWS):
        for col in range(CONTEXT):
            table[row, col] = _slot(row, col, page_size)
    return table


class StandInModelRunner:
    """The fields of the host's ``ModelRunner`` that the backends' constructors, the
    host's backend factory and the target-verify metadata paths read. With
    ``backend_cls`` None, ``_get_attention_backend`` is the host's own factory;
    otherwise it builds ``backend_cls`` (a test's own backend builder). ``built``
    collects the ids of every backend built."""

    def __init__(self, page_size: int, backend_cls: type | None, built: list | None) -> None:
        from sglang.srt.configs.model_config import AttentionArch
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
        from transformers import LlamaConfig

        hf_config = LlamaConfig(
            hidden_size=16, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1
        )

        self.backend_cls = backend_cls
        self.built = [] if built is None else built
        self.page_size = page_size
        self.device = "cpu"
        self.gpu_id = 0
        self.dtype = torch.float32
        self.sliding_window_size = None
        self.is_draft_worker = False
        self.draft_attention_backend = None
        self.use_mla_backend = False
        self.prefill_aware_swa = False
        self.kv_cache_dtype = torch.float32
        self.kv_cache_dtype_str = "auto"
        self.watermark_state = None
        self.init_new_workspace = False
        self.spec_algorithm = SimpleNamespace(
            is_speculative=lambda: True, is_dspark=lambda: False, is_uno=lambda: False
        )
        self.model_config = SimpleNamespace(
            is_encoder_decoder=False,
            is_local_attention_model=False,
            context_len=CONTEXT,
            attention_arch=AttentionArch.MHA,
            head_dim=8,
            v_head_dim=8,
            swa_v_head_dim=None,
            hf_text_config=hf_config,
            hf_config=hf_config,
            get_num_kv_heads=lambda *a: 2,
            get_max_num_attention_heads=lambda: 2,
            num_attention_layers=1,
            linear_attn_registry_result=None,
        )
        table = req_to_token(page_size)
        self.req_to_token_pool = SimpleNamespace(req_to_token=table, size=POOL_ROWS)
        self.token_to_kv_pool = SimpleNamespace(
            start_layer=0,
            get_v_head_dim=lambda: 8,
            get_value_buffer=lambda layer: torch.zeros((1, 2, 8)),
        )
        self.token_to_kv_pool_allocator = SimpleNamespace(page_size=page_size)
        self.kv_index_translator = KVIndexTranslator(
            req_to_token=table,
            token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
            token_to_kv_pool=self.token_to_kv_pool,
            page_size=page_size,
            device="cpu",
        )
        self.attn_backend = None
        self.decode_cuda_graph_runner = None

    def decode_num_tokens_per_req(self, *, num_draft_tokens: int | None = None) -> int:
        from sglang.srt.runtime_context import get_spec

        return num_draft_tokens or get_spec().speculative_num_draft_tokens

    def _get_attention_backend(self, init_new_workspace: bool = False):
        """The host's factory (``ModelRunner._get_attention_backend``: the resolved
        ``--attention-backend`` through the host's registry), or ``backend_cls``."""
        if self.backend_cls is None:
            from sglang.srt.model_executor.model_runner import ModelRunner

            backend = ModelRunner._get_attention_backend(self, init_new_workspace)
        else:
            self.init_new_workspace = init_new_workspace
            backend = self.backend_cls(self)
        self.built.append(id(backend))
        return backend


class StandInTarget:
    """The target worker: builds the ForwardBatch and runs the attention backend's
    metadata init, as the host's eager model runner does before the model forward."""

    def __init__(self, runner: StandInModelRunner) -> None:
        self.model_runner = runner
        self.seen: list[dict] = []

    def forward_batch_generation(self, batch, pp_proxy_tensors=None, is_verify=False):
        from sglang.srt.mem_cache.kv_loc_plan import KVLocPlan
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        assert is_verify and batch.forward_mode.is_target_verify()
        runner = self.model_runner
        fb = ForwardBatch(
            forward_mode=batch.forward_mode,
            batch_size=len(batch.reqs),
            input_ids=batch.input_ids,
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            out_cache_loc=batch.out_cache_loc,
            seq_lens_sum=int(batch.seq_lens.sum()),
            seq_lens_cpu=batch.seq_lens_cpu,
            spec_info=batch.spec_info,
            positions=batch.spec_info.positions,
        )
        fb.kv_loc_plan = KVLocPlan(
            source=runner.kv_index_translator,
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            seq_lens_cpu=batch.seq_lens_cpu,
            write_virtual=batch.out_cache_loc,
        )
        record = {"backend": runner.attn_backend, "spec_info": batch.spec_info, "fb": fb}
        try:
            runner.attn_backend.init_forward_metadata(fb)
        except Exception as exc:  # out-of-range indexing raises on CPU tensors
            record["error"] = f"{type(exc).__name__}: {exc}"
        self.seen.append(record)
        n = batch.input_ids.numel()
        return SimpleNamespace(
            logits_output=SimpleNamespace(next_token_logits=torch.zeros((n, 32))),
            next_token_ids=None,
            can_run_cuda_graph=False,
        )


def root_only_verify(verify_input, batch, logits_output, grammar_mask, **kw):
    """Stands in for the host's tree verify (GPU kernel): accept the root only."""
    bs, w = len(batch.reqs), verify_input.draft_token_num
    predict = torch.zeros(bs * w, dtype=torch.int32)
    accept_index = torch.full((bs, w), -1, dtype=torch.int32)
    accept_index[:, 0] = torch.arange(bs, dtype=torch.int32) * w
    return predict, torch.ones(bs, dtype=torch.int32), accept_index


def assign_extend_cache_locs(**kw) -> torch.Tensor:
    """The host's ``assign_extend_cache_locs_func`` (GPU kernel) on CPU."""
    from sglang_spec_ext.sglang.cpu.fallbacks import ops

    table = kw["req_to_token"]
    out = torch.empty(kw["batch_size"] * kw["draft_token_num"], dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(
        kw["req_pool_indices"], table, kw["start_offset"], kw["end_offset"], out, table.shape[1]
    )
    return out


def install_host_stand_ins(patch) -> None:
    """``patch(module, name, value)``: monkeypatch.setattr or a plain setattr."""
    from sglang.srt.layers.attention import attention_registry
    from sglang.srt.speculative import ngram_worker

    from sglang_spec_ext.sglang.cpu.fallbacks import ops

    patch(ngram_worker, "_is_cpu", False)  # build the verify input a GPU server builds
    patch(attention_registry, "get_device_capability", lambda *a, **k: (9, 0))  # an H100
    patch(ngram_worker, "eagle_sample", root_only_verify)
    patch(
        ngram_worker,
        "reconstruct_indices_from_tree_mask_func",
        ops.reconstruct_indices_from_tree_mask,
    )
    patch(ngram_worker, "assign_extend_cache_locs_func", assign_extend_cache_locs)
    for name in (
        "prepare_mamba_track_for_verify",
        "commit_mamba_states_after_verify",
        "move_accept_tokens_to_target_kvcache",
    ):
        patch(ngram_worker, name, lambda *a, **k: None)


def server_topk(page_size: int, backend: str, use_tree: bool) -> int:
    """``speculative_eagle_topk`` as our server-args hook sets it for SUFFIX."""
    from sglang_spec_ext.sglang.serving.server_args import handle_server_args

    os.environ["SGLANG_SPEC_EXT_USE_TREE"] = "1" if use_tree else "0"
    args = SimpleNamespace(
        device="cuda",
        speculative_num_draft_tokens=MAX_WIDTH,
        page_size=page_size,
        attention_backend=backend,
        max_running_requests=8,
        disable_overlap_schedule=True,
        enable_mixed_chunk=False,
    )
    handle_server_args("SUFFIX", args)
    return args.speculative_eagle_topk


# -- one case: a server at the startup width, every width the controller can choose ---
class Case:
    def __init__(self, backend: str, page_size: int, use_tree: bool) -> None:
        from sglang.srt.runtime_context import get_context

        self.backend, self.page_size, self.use_tree = backend, page_size, use_tree
        for k in list(os.environ):
            if k.startswith("SGLANG_SPEC_EXT_"):
                del os.environ[k]
        self.topk = server_topk(page_size, backend, use_tree)
        os.environ["SGLANG_SPEC_EXT_ADAPTIVE"] = "1"
        self._published = get_context().override_server_args(
            speculative_num_draft_tokens=MAX_WIDTH,
            speculative_eagle_topk=self.topk,
            speculative_num_steps=max(1, MAX_WIDTH // self.topk),
            page_size=page_size,
            attention_backend=backend,
        )
        self._published.install()

    def close(self) -> None:
        self._published.restore()

    def make_worker(self, backend_cls: type | None, startup_backend=None, built=None):
        """The adaptive worker over a target whose backend is built at the startup
        width; ``built`` (a list) collects every backend the factory builds."""
        from sglang_spec_ext.sglang.workers.adaptive_worker import AdaptiveSuffixWorker

        runner = StandInModelRunner(self.page_size, backend_cls, built)
        if startup_backend is not None:
            runner.attn_backend = startup_backend(runner)
        else:
            runner.attn_backend = runner._get_attention_backend()
        w = object.__new__(AdaptiveSuffixWorker)  # __init__ needs the scheduler's context
        w.draft_token_num = w.speculative_num_draft_tokens = MAX_WIDTH
        w.enable_overlap = False
        w.device = "cpu"
        w.max_batch_size = POOL_ROWS
        w.page_size = self.page_size
        w._target_worker = StandInTarget(runner)
        w.model_runner = runner
        w.token_to_kv_pool_allocator = None
        w._prev_decode_rids = set()
        w.grammar_tree_host = None
        w._init_drafter()
        w._plain_steps = False  # verify metadata per width: every step verifies here
        w._init_preallocated_tensors()
        w.init_cuda_graphs()  # what the scheduler calls after the target's graphs
        drafts: list[tuple[np.ndarray, np.ndarray]] = []
        prepare = w._prepare_draft_tokens

        def recording_prepare(batch):
            tokens, mask = prepare(batch)
            drafts.append((tokens.copy(), mask.copy()))
            return tokens, mask

        w._prepare_draft_tokens = recording_prepare
        return w, drafts

    def batch(self, worker):
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        reqs = [
            SimpleNamespace(rid=rid, origin_input_ids_unpadded=p, output_ids=list(o))
            for rid, (p, o) in REQUESTS.items()
        ]
        lens = torch.tensor([len(p) + len(o) for p, o in REQUESTS.values()], dtype=torch.int64)
        return SimpleNamespace(
            reqs=reqs,
            forward_mode=ForwardMode.DECODE,
            req_pool_indices=torch.tensor([POOL_INDEX[r] for r in REQUESTS], dtype=torch.int64),
            seq_lens=lens,
            seq_lens_cpu=lens.clone(),
            spec_info=None,
            input_ids=None,
            out_cache_loc=None,
            has_grammar=False,
            return_logprob=False,
            sampling_info=None,
            grammar_needs_sync=lambda: False,
            req_to_token_pool=worker.model_runner.req_to_token_pool,
        )

    def run_widths(self, worker, drafts, widths, check) -> dict[int, list[str]]:
        """One decode step per width; ``check(record, width, mask, batch)`` -> problems."""
        chosen = iter(widths)
        worker.controller.choose_k = lambda bs, rids: next(chosen) - 1
        problems: dict[int, list[str]] = {}
        for width in widths:
            batch = self.batch(worker)
            worker.forward_batch_generation(batch)
            record = worker._target_worker.seen[-1]
            tokens, mask = drafts[-1]
            assert record["spec_info"].draft_token_num == width
            if "error" in record:
                problems[width] = [f"metadata init raised {record['error']}"]
                continue
            found = check(record, width, mask.reshape(-1, width, width), batch)
            if found:
                problems[width] = found
        return problems


def ragged_step(case, lens, width: int = MAX_WIDTH, startup_backend=None) -> tuple:
    """One decode step of a ragged worker at ``width`` (the controller's choice; default
    the startup width), each request verifying ``lens`` tokens (root included, cut to the
    width) in place of its drafts' lengths: ``(worker, drafts, batch, record, lens as
    verified)``. ``startup_backend``: a builder of the target's backend (default: the
    host's factory). The worker is the adaptive one
    ``make_worker`` builds with the host's backend factory, with ragged verify on (what
    its ``__init__``, which the harness skips, sets up)."""
    worker, drafts = case.make_worker(None, startup_backend)
    worker.topk = case.topk
    worker._init_ragged()
    ragged = worker._ragged
    plan, planned = ragged.plan, []

    def forced_plan(batch, width, always=False):
        ragged._lens = np.minimum(np.asarray(lens, dtype=np.int64), width)
        planned.append(ragged._lens.tolist())
        return plan(batch, width, always)

    ragged.plan = forced_plan
    worker.controller.choose_k = lambda bs, rids: width - 1
    batch = case.batch(worker)
    worker.forward_batch_generation(batch)
    return worker, drafts, batch, worker._target_worker.seen[-1], planned[-1]


def has_branches(mask: np.ndarray) -> bool:
    """Whether a packed startup-width mask holds a node with two children."""
    tree = mask.reshape(-1, MAX_WIDTH, MAX_WIDTH)
    node = np.arange(MAX_WIDTH)
    ancestors = tree & (node[None, :] < node[:, None])
    parent = np.where(ancestors.any(-1), (ancestors * node).argmax(-1), -1)
    return any(np.bincount(p[p >= 0]).max(initial=0) > 1 for p in parent)


def widths_to_test() -> list[int]:
    """Every width, each reached from a different one (down, up, back to the top)."""
    return [MAX_WIDTH, *range(1, MAX_WIDTH), 2, MAX_WIDTH - 1, MAX_WIDTH]


def expect(problems: list[str], what: str, got, want) -> None:
    if isinstance(got, torch.Tensor) or isinstance(want, torch.Tensor):
        got_t, want_t = torch.as_tensor(got), torch.as_tensor(want)
        ok = got_t.shape == want_t.shape and bool((got_t.long() == want_t.long()).all())
        if not ok:
            problems.append(f"{what}: got {got_t.long().tolist()}, want {want_t.long().tolist()}")
    elif got != want:
        problems.append(f"{what}: got {got}, want {want}")


def expected_full_mask(seq_lens: list[int], tree: np.ndarray) -> torch.Tensor:
    """The FULL_MASK layout per request: W rows of [prefix ones | tree row]."""
    parts = []
    for b, seq_len in enumerate(seq_lens):
        w = tree.shape[1]
        rows = torch.cat(
            [torch.ones((w, seq_len), dtype=torch.bool), torch.from_numpy(tree[b]).bool()], dim=1
        )
        parts.append(rows.flatten())
    return torch.cat(parts)


def check_verify_input(record, width, tree, batch) -> list[str]:
    """What every backend reads: the host's verify input for our drafts at this width."""
    problems: list[str] = []
    spec = record["spec_info"]
    lens = batch.seq_lens.tolist()
    expect(problems, "num_tokens_per_req", spec.num_tokens_per_req, width)
    expect(problems, "draft tokens", spec.draft_token.numel(), len(lens) * width)
    expect(problems, "custom mask", spec.custom_mask, expected_full_mask(lens, tree))
    return problems


# -- FA3 ------------------------------------------------------------------------------
def graph_runner_takes(fb, captured_width: int) -> bool:
    """The host's ``DecodeCudaGraphRunner.can_run_graph`` up to its width check, for a
    runner captured at ``captured_width`` (only what that check reads is given)."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )

    runner = SimpleNamespace(ragged_verify_mode=False, captured_req_width=captured_width)
    try:
        return DecodeCudaGraphRunner.can_run_graph(runner, fb)
    except AttributeError:  # past the width check: it reads the rest of the runner
        return True


def check_fa3(record, width, tree, batch) -> list[str]:
    problems = check_verify_input(record, width, tree, batch)
    backend = record["backend"]
    if graph_runner_takes(record["fb"], MAX_WIDTH) != (width == MAX_WIDTH):
        problems.append("the startup-width CUDA graph runner's width check disagrees")
    md = backend.forward_metadata
    lens = batch.seq_lens.tolist()
    bs = len(lens)
    page = backend.page_size
    cu_q = torch.arange(0, bs * width + 1, width)
    expect(problems, "cu_seqlens_q", md.cu_seqlens_q, cu_q)
    expect(problems, "max_seq_len_q", md.max_seq_len_q, width)
    table = backend.req_to_token
    if backend.topk <= 1:
        # One causal pass over prefix + drafts.
        kv = torch.tensor(lens) + width
        expect(problems, "cache_seqlens", md.cache_seqlens_int32, kv)
        expect(problems, "cu_seqlens_k", md.cu_seqlens_k, torch.cat([torch.zeros(1), kv.cumsum(0)]))
        for b, seq_len in enumerate(lens):
            row = int(batch.req_pool_indices[b])
            n_pages = -(-(seq_len + width) // page)
            want = table[row, : n_pages * page : page] // page
            expect(problems, f"req {b} page table", md.page_table[b, :n_pages], want)
        if md.max_seq_len_k < max(lens) + width:
            problems.append(f"max_seq_len_k {md.max_seq_len_k} < {max(lens) + width}")
        return problems
    # Tree drafts: the prefix pass, then each draft token over the drafts it sees.
    kv = torch.tensor(lens)
    expect(problems, "prefix cache_seqlens", md.cache_seqlens_int32, kv)
    ex = backend.forward_metadata_spec_decode_expand
    expect(problems, "expand cu_seqlens_q", ex.cu_seqlens_q, torch.arange(0, bs * width + 1))
    visible = torch.from_numpy(tree).bool() | torch.eye(width, dtype=torch.bool)
    expect(problems, "expand cache_seqlens", ex.cache_seqlens_int32, visible.sum(-1).flatten())
    expect(
        problems,
        "expand cu_seqlens_k",
        ex.cu_seqlens_k,
        torch.cat([torch.zeros(1), visible.sum(-1).flatten().cumsum(0)]),
    )
    for b, seq_len in enumerate(lens):
        row = int(batch.req_pool_indices[b])
        draft_slots = table[row, seq_len : seq_len + width]
        for i in range(width):
            want = draft_slots[visible[b, i]]
            got = ex.page_table[b * width + i, : want.numel()]
            expect(problems, f"req {b} draft {i} expand page table", got, want)
    return problems


def fa3_backend_cls():
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend

    return FlashAttentionBackend


FA3_CASES = [
    pytest.param(1, True, id="page1-tree"),
    pytest.param(1, False, id="page1-chain"),
    pytest.param(16, False, id="page16-chain"),
]


def get_spec():
    from sglang.srt.runtime_context import get_spec as host_get_spec

    return host_get_spec()


@pytest.mark.parametrize(("page_size", "use_tree"), FA3_CASES)
def test_fa3_verify_metadata_follows_the_adaptive_width(monkeypatch, page_size, use_tree):
    install_host_stand_ins(monkeypatch.setattr)
    case = Case("fa3", page_size, use_tree)
    try:
        assert (case.topk > 1) == use_tree
        built: list[int] = []
        worker, drafts = case.make_worker(None, built=built)  # the host's factory
        startup = worker.model_runner.attn_backend
        assert startup.speculative_num_draft_tokens == MAX_WIDTH  # built at the startup width
        resolved_width = get_spec().speculative_num_draft_tokens
        problems = case.run_widths(worker, drafts, widths_to_test(), check_fa3)
        # Back at the startup width the startup backend (the one the CUDA graphs were
        # captured with) verifies again.
        last_backend = worker.model_runner.attn_backend
    finally:
        case.close()
    if use_tree:  # the first step (startup width) drafted a real tree, not chains only
        assert has_branches(drafts[0][1])
    assert not problems, "FA3 target-verify metadata does not match the width:\n" + "\n".join(
        f"  width {w}: " + "; ".join(p) for w, p in sorted(problems.items())
    )
    assert last_backend is startup
    # The per-width backends were built at start-up (init_cuda_graphs), one per other
    # width, and the resolved width is the startup one again.
    assert len(built) == MAX_WIDTH
    assert resolved_width == MAX_WIDTH


def test_a_backend_that_cannot_be_built_per_width_stops_the_start_up(monkeypatch):
    from sglang_spec_ext.sglang.verify.widths import VerifyWidthBackendError

    install_host_stand_ins(monkeypatch.setattr)
    case = Case("fa3", 1, True)
    try:

        def refuses(runner):
            if get_spec().speculative_num_draft_tokens != MAX_WIDTH:
                raise ValueError("no such width")
            return fa3_backend_cls()(runner)

        with pytest.raises(
            VerifyWidthBackendError, match="--attention-backend flashinfer or triton"
        ):
            case.make_worker(refuses)
        assert get_spec().speculative_num_draft_tokens == MAX_WIDTH
    finally:
        case.close()


def test_fa3_tree_drafts_at_page_size_above_one_are_refused_at_start_up():
    from sglang_spec_ext.sglang.serving.server_args import IncompatibleServerArgs

    with pytest.raises(IncompatibleServerArgs, match="--attention-backend fa3"):
        server_topk(16, "fa3", use_tree=True)


# -- triton and flashinfer (Triton kernels interpreted, in a subprocess) ---------------
def check_triton(record, width, tree, batch) -> list[str]:
    problems = check_verify_input(record, width, tree, batch)
    backend = record["backend"]
    md = backend.forward_metadata
    lens = batch.seq_lens.tolist()
    bs = len(lens)
    expect(problems, "qo_indptr", md.qo_indptr, torch.arange(0, bs * width + 1, width))
    expect(problems, "max_extend_len", md.max_extend_len, width)
    seq_mask = torch.tensor([width * (n + width) for n in lens])
    expect(problems, "mask_indptr", md.mask_indptr, torch.cat([torch.zeros(1), seq_mask.cumsum(0)]))
    expect(problems, "custom_mask", md.custom_mask, expected_full_mask(lens, tree))
    kv = torch.tensor(lens)  # the prefix; the drafts are the extend part
    expect(problems, "kv_indptr", md.kv_indptr, torch.cat([torch.zeros(1), kv.cumsum(0)]))
    table = backend.req_to_token
    want = torch.cat([table[int(batch.req_pool_indices[b]), :n] for b, n in enumerate(lens)])
    expect(problems, "kv_indices", md.kv_indices[: want.numel()], want)
    return problems


class RecordingPlan:
    """STAND-IN for a flashinfer prefill wrapper: ``begin_forward`` is flashinfer's
    ``plan`` (CUDA); it records what the host plans the verify with."""

    is_cuda_graph_enabled = False
    _custom_mask_buf = None

    def __init__(self) -> None:
        self.planned: dict | None = None

    def begin_forward(self, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, *a, **kw):
        self.planned = {
            "qo_indptr": qo_indptr.clone(),
            "kv_indptr": kv_indptr.clone(),
            "kv_indices": kv_indices.clone(),
            "kv_last_page_len": kv_last_page_len.clone(),
            "custom_mask": None if kw.get("custom_mask") is None else kw["custom_mask"].clone(),
        }


def flashinfer_target_verify_backend(runner: StandInModelRunner):
    """A real ``FlashInferAttnBackend`` object holding what its target-verify
    ``init_forward_metadata`` reads: the host's REAL prefill indices updater, and the
    recording stand-in for the flashinfer wrapper. Built without its constructor,
    which creates flashinfer (CUDA) wrappers."""
    from sglang.srt.layers.attention import flashinfer_backend as fi

    backend = object.__new__(fi.FlashInferAttnBackend)
    backend.kv_index_translator = runner.kv_index_translator
    backend.dq_paged_kernel_lens = None
    backend.use_sliding_window_kv_pool = False
    backend.prefill_wrappers_verify = [RecordingPlan()]
    backend.req_to_token = runner.req_to_token_pool.req_to_token
    backend.page_size = runner.page_size
    updater = object.__new__(fi.FlashInferIndicesUpdaterPrefill)
    updater.num_qo_heads = updater.num_kv_heads = 2
    updater.head_dim = 8
    updater.data_type = updater.q_data_type = torch.float32
    updater.sliding_window_size = None
    updater.attn_backend = backend
    updater.kv_indptr = [torch.zeros(POOL_ROWS + 1, dtype=torch.int32)]
    updater.qo_indptr = [torch.zeros(POOL_ROWS + 1, dtype=torch.int32)]
    updater.kv_last_page_len = torch.ones(POOL_ROWS, dtype=torch.int32)
    updater._swa_kv_pool = None
    updater.prefill_wrapper_ragged = None
    updater.update = updater.update_single_wrapper
    backend.indices_updater_prefill = updater
    return backend


def check_flashinfer(record, width, tree, batch) -> list[str]:
    problems = check_verify_input(record, width, tree, batch)
    backend = record["backend"]
    plan = backend.prefill_wrappers_verify[0].planned
    lens = batch.seq_lens.tolist()
    bs = len(lens)
    expect(problems, "qo_indptr", plan["qo_indptr"], torch.arange(0, bs * width + 1, width))
    kv = torch.tensor(lens) + width
    expect(problems, "kv_indptr", plan["kv_indptr"], torch.cat([torch.zeros(1), kv.cumsum(0)]))
    table = backend.req_to_token
    want = torch.cat(
        [table[int(batch.req_pool_indices[b]), : n + width] for b, n in enumerate(lens)]
    )
    expect(problems, "kv_indices", plan["kv_indices"][: want.numel()], want)
    expect(problems, "custom_mask", plan["custom_mask"], expected_full_mask(lens, tree))
    return problems


def interpreted_host() -> None:
    """In an interpreted subprocess (``TRITON_INTERPRET=1``): the CPU placeholders of the
    host's GPU modules, the harness's stand-ins, one rank without decode context
    parallelism (the process builds no process groups)."""
    from sglang.srt.runtime_context import get_parallel

    from sglang_spec_ext.sglang.cpu import placeholders as cpu_placeholders

    cpu_placeholders.install()
    install_host_stand_ins(setattr)
    get_parallel().override_permanently(attn_dcp_rank=0)


def backend_main(backend: str, cases: list[tuple[int, bool]]) -> dict:
    """Run in the subprocess (``TRITON_INTERPRET=1``): problems per case and width."""
    interpreted_host()
    results = {}
    for page_size, use_tree in cases:
        case = Case(backend, page_size, use_tree)
        try:
            if backend == "triton":
                worker, drafts = case.make_worker(None)  # the host's factory
                check = check_triton
            else:
                worker, drafts = case.make_worker(None, flashinfer_target_verify_backend)
                check = check_flashinfer
            startup = worker.model_runner.attn_backend
            problems = case.run_widths(worker, drafts, widths_to_test(), check)
            tree_seen = has_branches(drafts[0][1])
            results[f"page{page_size}-{'tree' if use_tree else 'chain'}"] = {
                "topk": case.topk,
                "problems": {str(w): p for w, p in problems.items()},
                # These backends read the width from spec_info: one backend for all widths.
                "same_backend": worker.model_runner.attn_backend is startup,
                "tree_drafted": bool(tree_seen),
            }
        finally:
            case.close()
    return results


def _run_interpreted(backend: str, cases: list[tuple[int, bool]]) -> dict:
    code = textwrap.dedent(
        f"""
        import json, os
        os.environ["TRITON_INTERPRET"] = "1"
        from tests.host.test_verify_attention_metadata import backend_main
        print("RESULT " + json.dumps(backend_main({backend!r}, {cases!r})))
        """
    )
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"subprocess failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len("RESULT ") :])


def _assert_clean(backend: str, results: dict) -> None:
    bad = {k: v["problems"] for k, v in results.items() if v["problems"]}
    assert not bad, f"{backend} target-verify metadata does not match the width: {bad}"
    for key, v in results.items():
        assert v["same_backend"], key
        if key.endswith("tree"):
            assert v["topk"] > 1 and v["tree_drafted"], key


def test_triton_verify_metadata_follows_the_adaptive_width():
    results = _run_interpreted("triton", [(1, True), (1, False), (16, False)])
    _assert_clean("triton", results)


def test_flashinfer_verify_metadata_follows_the_adaptive_width():
    results = _run_interpreted("flashinfer", [(1, True), (16, True), (16, False)])
    _assert_clean("flashinfer", results)
