"""Plain decode steps inside speculative workers: speculation off costs nothing.

A decode step with nothing to verify still goes through the host's speculative path:
at zero draft steps (our controller's and the host's EMA policy's choice at large
batches) ``EAGLEWorkerV2`` builds a one-node verify tree and runs a TARGET_VERIFY
forward (tree-mask attention) with the verify sampler; SUFFIX with no draft for any
request of the batch verifies the full width, the root plus ``W - 1`` padding rows.
Measured on the CPU engine that floor is 0.90-0.93x plain decoding
(``benchmarks/results/adaptive_smollm2*.json``).

Here such a step runs the target's plain DECODE forward (the attention backend's decode
kernels, one token per request) and the plain sampler, and returns the result in the
exact shape the host's verify returns at that width, so everything after it is the
host's own code: the draft extend (or its skip and our draft-KV repair) for model
drafts, the overlap relay (``FutureMap``: the same ``next_draft_input`` fields),
the scheduler's result processing and KV accounting (one accepted token, the step's
unused slots stay reserved as after a verify that accepts nothing).

* **Model drafts** (EAGLE, EAGLE3, STANDALONE, HYBRID, NEXTN): an AROUND hook on
  ``EAGLEWorkerV2.verify`` takes a step whose verify input is the host's trivial one
  (``draft_token_num == 1``, ``spec_steps == 0``: what ``_build_trivial_verify_input``
  builds at zero steps).
* **SUFFIX** (``suffix_worker.py``): a step where the drafter proposed nothing for any
  request of the batch (decided on the drafts every TP rank verifies, so all ranks
  take the same path).

Where the host's path stays (counted per reason in :data:`STATS`): a CUDA graph would
run the step (a TARGET_VERIFY graph is what a speculative server captures; replaying
it at width 1 is already a decode-shaped forward, and a DECODE batch must not reach a
verify-shaped graph), and what the plain path here does not reproduce: logprobs,
grammar, pipeline or DP-attention layouts, hierarchical sparse attention, Mamba state
tracking, KV location plans, watermarks. Greedy output is unchanged (the same target
forward's argmax); with sampling each token is drawn from the target's distribution
by the host's sampler, as without speculation. ``SGLANG_SPEC_EXT_PLAIN_STEPS=0``
turns it off.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger("sglang_spec_ext")

VERIFY_TARGET = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.verify"
#: ScheduleBatch fields a plain forward rewrites for its ForwardBatch and restores.
_SAVED = ("forward_mode", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "orig_seq_lens", "spec_info")


#: Log line prefix of the counters (``key=value`` pairs), at most every stats interval.
STATS_LOG_MARK = "sglang-spec-ext plain steps: "


@dataclass
class PlainStepStats:
    """Steps run as plain decode steps, and steps left to the host's path by reason."""

    plain: int = 0
    #: fixed-width SUFFIX steps with no draft replayed on its width-1 verify graphs
    #: (``suffix_worker.SuffixWorker._narrow_step``)
    narrow: int = 0
    host: Counter[str] = field(default_factory=Counter)
    log_interval_s: float = 30.0
    _logged_at: float | None = None

    def reset(self) -> None:
        self.plain = 0
        self.narrow = 0
        self.host.clear()

    def count(self, plain: bool, reason: str = "", narrow: bool = False) -> None:
        if narrow:
            self.narrow += 1
        elif plain:
            self.plain += 1
        else:
            self.host[reason] += 1
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= self.log_interval_s:
            self._logged_at = now
            logger.info("%s%s", STATS_LOG_MARK, self.line())

    def line(self) -> str:
        host = " ".join(f"host_{k}={v}" for k, v in sorted(self.host.items()))
        narrow = f" narrow_graph={self.narrow}" if self.narrow else ""
        return f"plain={self.plain} {host}{narrow}".strip()


STATS = PlainStepStats()


def ineligible(batch: Any, pp_proxy_tensors: Any = None) -> str | None:
    """Why the plain path cannot serve ``batch`` (None: it can)."""
    from sglang.srt.runtime_context import get_parallel

    if batch.forward_mode.is_idle():
        return "idle"
    if pp_proxy_tensors is not None or get_parallel().pp_size > 1:
        return "pipeline"
    if batch.return_logprob:
        return "logprob"
    if batch.has_grammar:
        return "grammar"
    if getattr(batch, "global_num_tokens", None) is not None:
        return "dp-attention"
    if getattr(batch, "hisparse_coordinator", None) is not None:
        return "hisparse"
    if getattr(batch, "mamba_track_indices", None) is not None:
        return "mamba"
    info = batch.sampling_info
    if getattr(info, "has_watermark_candidates", False):
        return "watermark"
    return None


def plain_forward(
    target_worker: Any, batch: Any, input_ids: torch.Tensor, out_cache_loc: torch.Tensor
) -> tuple[Any, torch.Tensor, Any] | None:
    """The target's DECODE forward of ``input_ids`` (one token per request, written to
    ``out_cache_loc``) and the plain sampler's tokens: ``(logits_output, next_token_ids,
    forward_batch)``; None where a CUDA graph would run the step (counted; the caller
    keeps the host's path). ``batch`` is a speculative decode batch (``seq_lens`` without this
    step's token); its fields are restored before returning."""
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )

    runner = target_worker.model_runner
    bs = len(batch.seq_lens)
    saved = {name: getattr(batch, name) for name in _SAVED}
    try:
        batch.forward_mode = ForwardMode.DECODE
        batch.input_ids = input_ids
        batch.out_cache_loc = out_cache_loc
        batch.spec_info = None  # a decode batch of the target, not a draft decode
        batch.seq_lens = saved["seq_lens"] + 1  # plain decoding counts the input token
        if saved["seq_lens_cpu"] is not None:
            batch.seq_lens_cpu = saved["seq_lens_cpu"] + 1
        if saved["seq_lens_sum"] is not None:
            batch.seq_lens_sum = saved["seq_lens_sum"] + bs
        if saved["orig_seq_lens"] is not None:
            batch.orig_seq_lens = saved["orig_seq_lens"] + 1
        capture = (
            CaptureHiddenMode.NULL
            if runner.spec_algorithm.is_standalone() or runner.spec_algorithm.is_none()
            else CaptureHiddenMode.FULL  # an EAGLE draft extend reads the target's states
        )
        forward_batch = ForwardBatch.init_new(
            batch, runner, capture_hidden_mode=capture, return_hidden_states_before_norm=False
        )
    finally:
        for name, value in saved.items():
            setattr(batch, name, value)
    graphs = runner.decode_cuda_graph_runner
    if graphs is not None and graphs.can_run_graph(forward_batch):
        _host_path("graph")
        return None
    out = target_worker.forward_batch_generation(
        batch=None, forward_batch=forward_batch, is_verify=True
    )
    next_token_ids = runner.sample(out.logits_output, forward_batch)
    return out.logits_output, next_token_ids, forward_batch


def _decode_slots(batch: Any, req_to_token: torch.Tensor, device: Any) -> torch.Tensor:
    """Each request's KV slot for this step's one token (position ``seq_len``; the
    scheduler allocated it with the step's verify slots)."""
    from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_uniform_func

    return assign_extend_cache_locs_uniform_func(
        req_pool_indices=batch.req_pool_indices,
        req_to_token=req_to_token,
        start_offset=batch.seq_lens,
        batch_size=len(batch.seq_lens),
        draft_token_num=1,
        device=device,
    )


def _host_path(reason: str) -> None:
    STATS.count(False, reason)


def eagle_plain_verify(worker: Any, batch: Any) -> Any | None:
    """The zero-step verify of ``EAGLEWorkerV2`` as a plain decode step, or None where
    the host's verify must run. Returns what ``run_eagle_verify`` returns at width 1."""
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    verify_input = batch.spec_info
    if verify_input.kv_loc_plan is not None:
        _host_path("kv-loc-plan")
        return None
    bs = len(batch.seq_lens)
    input_ids = verify_input.draft_token  # the previous step's bonus tokens
    if verify_input.prepared_out_cache_loc is not None:
        out_cache_loc = verify_input.prepared_out_cache_loc
    else:
        out_cache_loc = _decode_slots(batch, worker.req_to_token_pool.req_to_token, worker.device)
    ran = plain_forward(worker.target_worker, batch, input_ids, out_cache_loc)
    if ran is None:
        return None
    logits_output, next_token_ids, forward_batch = ran
    # The state the host's verify leaves on the batch (eagle_prepare_for_verify).
    batch.input_ids = input_ids
    batch.out_cache_loc = out_cache_loc
    batch.forward_mode = ForwardMode.TARGET_VERIFY
    accept_lens = torch.ones(bs, dtype=torch.int32, device=worker.device)
    STATS.count(True)
    return GenerationBatchResult(
        logits_output=logits_output,
        next_token_ids=next_token_ids,
        can_run_cuda_graph=False,
        speculative_num_draft_tokens=1,
        next_draft_input=EagleDraftInput(bonus_tokens=next_token_ids.to(torch.int32)),
        accept_lens=accept_lens,
        accept_index=torch.arange(bs, dtype=torch.int32, device=worker.device).unsqueeze(1),
        new_seq_lens=batch.seq_lens + accept_lens,
        extra_keep_alive_refs=[forward_batch],
    )


def ngram_plain_step(worker: Any, batch: Any, roots: torch.Tensor, on_publish: Any) -> Any | None:
    """A SUFFIX decode step with no draft for any request as a plain decode step, or None
    where the host's verify must run. ``roots``: each request's last committed token (the
    verify input's root column). Returns what the host's NGRAM verify returns when every
    request accepts only its bonus token, at the step's width."""
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.ngram_info import NgramVerifyInput

    bs = len(batch.reqs)
    width = worker.draft_token_num
    input_ids = roots.to(device=worker.device, dtype=torch.int64, non_blocking=True)
    out_cache_loc = _decode_slots(batch, batch.req_to_token_pool.req_to_token, worker.device)
    ran = plain_forward(worker.target_worker, batch, input_ids, out_cache_loc)
    if ran is None:
        return None
    logits_output, predict, _forward_batch = ran
    accept_lens = torch.ones(bs, dtype=torch.int32, device=worker.device)
    new_seq_lens = batch.seq_lens + accept_lens
    # The host's layout: per request `width` accepted-token slots, the first one used.
    accept_tokens = torch.zeros((bs, width), dtype=torch.int32, device=worker.device)
    accept_tokens[:, 0] = predict
    accept_tokens = accept_tokens.flatten()
    if on_publish is not None:
        on_publish(new_seq_lens)
    worker.after_plain_step(batch)
    # The state the host's NGRAM verify leaves on the batch.
    batch.input_ids = input_ids
    batch.out_cache_loc = out_cache_loc
    batch.forward_mode = ForwardMode.DECODE
    STATS.count(True)
    return GenerationBatchResult(
        logits_output=logits_output,
        next_token_ids=accept_tokens,
        can_run_cuda_graph=False,
        accept_lens=accept_lens,
        new_seq_lens=new_seq_lens,
        next_draft_input=NgramVerifyInput(
            draft_token_num=width,
            new_seq_lens=new_seq_lens,
            accept_tokens=accept_tokens,
            accept_lens=accept_lens,
        ),
        speculative_num_draft_tokens=worker.speculative_num_draft_tokens,
    )


def verify_hook(
    original: Callable[..., Any],
    worker: Any,
    batch: Any,
    pp_proxy_tensors: Any = None,
    grammar_barrier: Any = None,
) -> Any:
    """AROUND ``EAGLEWorkerV2.verify``: the trivial zero-step verify as a plain step."""
    verify_input = batch.spec_info
    if getattr(verify_input, "draft_token_num", 0) == 1 and verify_input.spec_steps == 0:
        reason = ineligible(batch, pp_proxy_tensors)
        if reason is None:
            result = eagle_plain_verify(worker, batch)
            if result is not None:
                return result
        else:
            _host_path(reason)
    return original(
        worker, batch, pp_proxy_tensors=pp_proxy_tensors, grammar_barrier=grammar_barrier
    )


def install_plain_steps(log_interval_s: float = 30.0) -> list[str]:
    """Register the zero-step hook on the host's EAGLE V2 worker (idempotent)."""
    STATS.log_interval_s = float(log_interval_s)
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once([(VERIFY_TARGET, verify_hook, HookType.AROUND)])
    return ["plain_steps"]
