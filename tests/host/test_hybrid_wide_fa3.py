"""HYBRID's wide steps on the host's REAL FA3 backend (sglang/workers/hybrid_wide.py).

FA3 (``FlashAttentionBackend``, the host's default on Hopper) sizes its target-verify
metadata by the verify width it was built with, so a wide step (a winning suffix draft
verified at its own length, wider than the model's chain) needs a target backend of the
wide width. The HYBRID worker builds one per wide width at start-up with the host's own
factory and swaps it in for a wide step's verify, back after the step. Here, on CPU:

* the backends are the real class from the host's factory on a stand-in model runner
  (the harness of ``test_verify_attention_metadata.py``; the registry's device query
  answers an H100);
* a wide verify input built by the worker (``build_wide_input``, FULL_MASK as FA3 reads
  it, tree drafts at ``--speculative-eagle-topk 2``) goes through the real
  ``init_forward_metadata`` of the backend the model runner holds during the step;
* the attention FA3 computes from that metadata (its two-pass cascade, rendered in torch
  by ``test_fa3_ragged_tree_verify.cascade_verify``; the kernel is CUDA-only) equals the
  plugin's tree verify of the same rows, padded and ragged (the plugin's FA3 cut,
  through the worker's compact forward); on the model's-width backend it does not.

What only a GPU shows: the kernels on this metadata and the eager wide steps' cost.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_spec_ext.sglang.verify.tree_mask import FULL_MASK
from sglang_spec_ext.sglang.workers.hybrid_wide import WideStepsMixin
from sglang_spec_ext.verify.layout import tree_mask
from tests.host.test_fa3_ragged_tree_verify import DIM, HEADS, KV_HEADS, SCALE, cascade_verify
from tests.host.test_verify_attention_metadata import (
    StandInModelRunner,
    install_host_stand_ins,
    req_to_token,
)

MODEL_WIDTH, SUFFIX_WIDTH, TOPK = 4, 10, 2
SEQ_LENS = [10, 19, 13]
POOL_INDEX = [3, 1, 4]
#: Per request: (draft tokens, parents). A model tree (topk 2 at the model's width), an
#: 8-token suffix chain, a 6-node suffix tree: the step verifies at width 9.
ROWS = [
    ([31, 32, 33], [-1, -1, 0]),
    ([41, 42, 43, 44, 45, 46, 47, 48], [-1, 0, 1, 2, 3, 4, 5, 6]),
    ([51, 52, 53, 54, 55, 56], [-1, 0, 0, 1, 3, 2]),
]
WIDE = 1 + max(len(t) for t, _ in ROWS)


class Target:
    """The target worker: the host's eager forward builds the attention metadata on the
    backend the model runner holds (what the EAGLE verify's forward batch carries)."""

    def __init__(self, runner: StandInModelRunner) -> None:
        self.model_runner = runner
        self.seen: list[dict] = []

    def forward_batch_generation(self, forward_batch=None, is_verify=False, **kw):
        assert is_verify and forward_batch.forward_mode.is_target_verify()
        backend = self.model_runner.attn_backend
        backend.init_forward_metadata(forward_batch)
        self.seen.append({
            "backend": backend,
            "out_cache_loc": forward_batch.out_cache_loc.clone(),
            "md": backend.forward_metadata,
            "ex": backend.forward_metadata_spec_decode_expand,
        })  # fmt: skip
        rows = forward_batch.input_ids.numel()
        out = SimpleNamespace(next_token_logits=torch.zeros((rows, 32)), hidden_states=None)
        return SimpleNamespace(logits_output=out)


class Worker(WideStepsMixin):
    """The wide-step part of a HYBRID worker over the stand-in target."""

    topk = TOPK

    def __init__(self, runner: StandInModelRunner, topk: int = TOPK) -> None:
        self.topk = topk
        self.speculative_num_draft_tokens = MODEL_WIDTH
        self._target_worker = Target(runner)
        self._draft_worker = SimpleNamespace(speculative_num_draft_tokens=MODEL_WIDTH)
        self._init_wide(SUFFIX_WIDTH, 0.1)

    def _suffix_drafter(self):
        return None

    def _mask_mode(self) -> int:
        return FULL_MASK


@pytest.fixture
def fa3(monkeypatch, request):
    """Server args of a HYBRID server on FA3 and the target's backend at the model width
    (``--speculative-eagle-topk`` 2 unless the test's ``param`` says otherwise)."""
    from sglang.srt.runtime_context import get_context

    from sglang_spec_ext.sglang.verify.fa3_ragged import install_fa3_ragged

    for k in list(os.environ):
        if k.startswith("SGLANG_SPEC_EXT_"):
            monkeypatch.delenv(k)
    install_host_stand_ins(monkeypatch.setattr)
    install_fa3_ragged()  # the host's HookRegistry (inert without per-request lengths)
    published = get_context().override_server_args(
        speculative_num_draft_tokens=MODEL_WIDTH,
        speculative_eagle_topk=getattr(request, "param", TOPK),
        speculative_num_steps=MODEL_WIDTH - 1,
        page_size=1,
        attention_backend="fa3",
    )
    published.install()
    try:
        built: list[int] = []
        runner = StandInModelRunner(1, None, built)
        runner.attn_backend = runner._get_attention_backend()
        yield runner, built
    finally:
        published.restore()


def _wide_step(worker: Worker, rows=ROWS):
    """The step's wide verify input (the worker at the wide width) and its batch."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    bs = len(rows)
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int64)
    roots = torch.tensor([7, 8, 9], dtype=torch.int64)
    narrow = torch.zeros((bs, MODEL_WIDTH), dtype=torch.int64)
    narrow[:, 0] = roots
    vi = SimpleNamespace(
        draft_token=narrow.view(-1), positions=torch.zeros(bs * MODEL_WIDTH, dtype=torch.int64),
        retrieve_index=torch.zeros((bs, MODEL_WIDTH), dtype=torch.int64),
        retrieve_next_token=torch.zeros((bs, MODEL_WIDTH), dtype=torch.int64),
        retrieve_cum_len=None, spec_steps=MODEL_WIDTH - 1, topk=worker.topk,
        capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=None,
        seq_lens_cpu=seq_lens.clone(),
    )  # fmt: skip
    batch = SimpleNamespace(seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone())
    tokens = np.zeros((bs, WIDE), dtype=np.int64)
    masks = np.zeros((bs, WIDE, WIDE), dtype=bool)
    for b, (toks, parents) in enumerate(rows):
        tokens[b, 1 : 1 + len(toks)] = toks
        masks[b] = tree_mask(parents, WIDE)
    wide = worker._widen(batch, vi, tokens, masks)
    assert int(wide.draft_token_num) == WIDE
    return wide, batch, masks


def _verify_batch(runner: StandInModelRunner, wide, batch):
    """The target-verify forward batch of the wide input (what the host's EAGLE verify
    prepares: the verify tokens' KV slots after each request's committed ones)."""
    from sglang.srt.mem_cache.kv_loc_plan import KVLocPlan
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    table = runner.req_to_token_pool.req_to_token
    pool = torch.tensor(POOL_INDEX, dtype=torch.int64)
    loc = torch.cat([table[p, s : s + WIDE] for p, s in zip(POOL_INDEX, SEQ_LENS, strict=True)])
    fb = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=len(ROWS),
        input_ids=wide.draft_token.clone(), req_pool_indices=pool, seq_lens=batch.seq_lens,
        out_cache_loc=loc.to(torch.int64), seq_lens_sum=int(batch.seq_lens.sum()),
        seq_lens_cpu=batch.seq_lens_cpu, spec_info=wide, positions=wide.positions,
    )  # fmt: skip
    fb.kv_loc_plan = KVLocPlan(source=runner.kv_index_translator, req_pool_indices=pool,
                               seq_lens=batch.seq_lens, seq_lens_cpu=batch.seq_lens_cpu,
                               write_virtual=fb.out_cache_loc)  # fmt: skip
    return fb


def _attention(record, masks, lens):
    """FA3's cascade on the recorded metadata and the plugin's tree verify of the rows."""
    from sglang_spec_ext.sglang.cpu.fallbacks.verify_attention import tree_verify_attention

    table = req_to_token(1)
    torch.manual_seed(0)
    slots = int(table.max()) + 1
    k_pool, v_pool = torch.randn(slots, KV_HEADS, DIM), torch.randn(slots, KV_HEADS, DIM)
    q = torch.randn(int(sum(lens)), HEADS, DIM)
    got = cascade_verify(q, k_pool, v_pool, record["md"], record["ex"])
    prefix = [table[p, :s] for p, s in zip(POOL_INDEX, SEQ_LENS, strict=True)]
    want = tree_verify_attention(q, k_pool, v_pool, prefix, record["out_cache_loc"],
                                 torch.from_numpy(masks), scaling=SCALE, lens=list(lens))  # fmt: skip
    return got, want


def test_hybrid_on_fa3_builds_a_target_backend_per_wide_width_at_start_up(fa3):
    runner, built = fa3
    startup = runner.attn_backend
    worker = Worker(runner)
    worker._resolve_wide()
    assert worker._wide_width == SUFFIX_WIDTH, "wide steps refused on FA3"
    assert len(built) == 1 + SUFFIX_WIDTH - MODEL_WIDTH  # the startup one, then 5 .. 10
    for width in range(MODEL_WIDTH + 1, SUFFIX_WIDTH + 1):
        backend = worker._wide_backends.backend(width)
        assert type(backend) is type(startup) and backend.speculative_num_draft_tokens == width
    assert runner.attn_backend is startup
    route = worker._ragged_route  # tree drafts: FA3's cascade metadata cut per request
    assert route.backend == "FlashAttentionBackend" and not route.host_layout


def test_a_wide_step_verifies_on_the_backend_of_its_width(fa3):
    runner, _ = fa3
    startup = runner.attn_backend
    worker = Worker(runner)
    worker._resolve_wide()
    wide, batch, masks = _wide_step(worker)
    assert runner.attn_backend.speculative_num_draft_tokens == WIDE
    assert worker._draft_worker.speculative_num_draft_tokens == WIDE
    worker.target_worker.forward_batch_generation(
        forward_batch=_verify_batch(runner, wide, batch), is_verify=True
    )
    record = worker._target_worker.seen[-1]
    assert record["md"].cu_seqlens_q.tolist() == list(range(0, 3 * WIDE + 1, WIDE))
    got, want = _attention(record, masks, [WIDE] * len(ROWS))
    assert float((got - want).abs().max()) < 1e-5
    worker._narrow_back()
    assert runner.attn_backend is startup and worker.speculative_num_draft_tokens == MODEL_WIDTH
    assert worker._draft_worker.speculative_num_draft_tokens == MODEL_WIDTH

    # The same wide verify on the model's-width backend (what a wide step on FA3 would
    # run without one of its width) is misread: it raises or attends wrongly.
    wide, batch, masks = _wide_step(worker)
    worker._narrow_back()
    assert runner.attn_backend is startup
    try:
        worker.target_worker.forward_batch_generation(
            forward_batch=_verify_batch(runner, wide, batch), is_verify=True
        )
    except (RuntimeError, IndexError, ValueError):
        return
    record = worker._target_worker.seen[-1]
    assert record["md"].cu_seqlens_q.tolist()[-1] == 3 * MODEL_WIDTH  # rows past 12 unread
    got, want = _attention(record, masks, [WIDE] * len(ROWS))
    assert not torch.allclose(got, want, atol=1e-3)  # unread rows come out NaN


def test_a_ragged_wide_step_verifies_each_row_at_its_own_length(fa3):
    runner, _ = fa3
    worker = Worker(runner)
    worker._resolve_wide()
    wide, batch, masks = _wide_step(worker)
    nodes = np.array([len(t) for t, _ in ROWS])
    worker._plan_ragged(wide, nodes, WIDE)
    lens = (nodes + 1).tolist()
    worker.target_worker.forward_batch_generation(
        forward_batch=_verify_batch(runner, wide, batch), is_verify=True
    )
    record = worker._target_worker.seen[-1]
    assert record["backend"].speculative_num_draft_tokens == WIDE
    assert record["out_cache_loc"].numel() == sum(lens) < WIDE * len(ROWS)
    assert record["md"].cu_seqlens_q.tolist() == [0, *np.cumsum(lens).tolist()]
    got, want = _attention(record, masks, lens)
    assert float((got - want).abs().max()) < 1e-5
    assert worker._ragged_stats.as_dict()["ragged_verify_steps"] == 1
    worker._narrow_back()


def test_fa3_draft_extend_reads_the_wide_width_from_the_batch(fa3):
    """The draft extend after a wide step runs ``W_s`` tokens per request on the draft's
    FA3 backend, built at the model's width: its eager metadata follows the batch's
    extend lengths (``prepare_for_draft_extend`` sets them), so it needs no backend per
    width."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    runner, _ = fa3
    backend = runner.attn_backend
    assert backend.speculative_num_draft_tokens == MODEL_WIDTH
    bs = len(SEQ_LENS)
    post = torch.tensor(SEQ_LENS, dtype=torch.int64) + WIDE
    fb = ForwardBatch(
        forward_mode=ForwardMode.DRAFT_EXTEND_V2, batch_size=bs,
        input_ids=torch.zeros(bs * WIDE, dtype=torch.int64),
        req_pool_indices=torch.tensor(POOL_INDEX, dtype=torch.int64), seq_lens=post,
        out_cache_loc=torch.zeros(bs * WIDE, dtype=torch.int64),
        seq_lens_sum=int(post.sum()), seq_lens_cpu=post.clone(),
        extend_seq_lens=torch.full((bs,), WIDE, dtype=torch.int32),
        extend_seq_lens_cpu=[WIDE] * bs, extend_prefix_lens_cpu=SEQ_LENS,
        positions=torch.zeros(bs * WIDE, dtype=torch.int64),
    )  # fmt: skip
    backend.init_forward_metadata(fb)
    md = backend.forward_metadata
    assert md.cu_seqlens_q.tolist() == list(range(0, bs * WIDE + 1, WIDE))
    assert md.max_seq_len_q == WIDE
    assert md.cache_seqlens_int32.tolist() == post.tolist()


#: At ``--speculative-eagle-topk 1`` every row is a chain (the model's, and suffix drafts:
#: FA3 picks its chain kernels from the start-up topk).
CHAINS = [([31, 32, 33], [-1, 0, 1]), ROWS[1], ([51, 52, 53, 54, 55], [-1, 0, 1, 2, 3])]


@pytest.mark.parametrize("fa3", [1], indirect=True)
def test_chains_at_topk_1_verify_wide_on_the_hosts_ragged_layout(fa3):
    """Chains on FA3 (its causal target verify): padded at the wide width on the backend
    of that width, then ragged through the host's ``RaggedVerifyLayout``."""
    runner, _ = fa3
    worker = Worker(runner, topk=1)
    worker._resolve_wide()
    assert not worker._suffix_trees and worker._ragged_route.host_layout
    seq = torch.tensor(SEQ_LENS, dtype=torch.int32)
    wide, batch, _ = _wide_step(worker, CHAINS)
    worker.target_worker.forward_batch_generation(
        forward_batch=_verify_batch(runner, wide, batch), is_verify=True
    )
    md = worker._target_worker.seen[-1]["md"]
    assert md.cu_seqlens_q.tolist() == list(range(0, 3 * WIDE + 1, WIDE))
    assert md.max_seq_len_q == WIDE and md.cache_seqlens_int32.tolist() == (seq + WIDE).tolist()
    worker._narrow_back()

    wide, batch, _ = _wide_step(worker, CHAINS)
    nodes = np.array([len(t) for t, _ in CHAINS])
    worker._plan_ragged(wide, nodes, WIDE)
    lens = torch.from_numpy(nodes + 1).to(torch.int32)
    worker.target_worker.forward_batch_generation(
        forward_batch=_verify_batch(runner, wide, batch), is_verify=True
    )
    record = worker._target_worker.seen[-1]
    assert record["backend"].speculative_num_draft_tokens == WIDE
    md = record["md"]
    assert md.cu_seqlens_q.tolist() == [0, *torch.cumsum(lens, 0).tolist()]
    assert md.cache_seqlens_int32.tolist() == (seq + lens).tolist()
    assert worker._ragged_stats.host_layout_steps == 1
    worker._narrow_back()
