"""The draft-KV repair's rebuild forward: one EXTEND forward of the draft model.

Over each marked request's unwritten positions (``kv_repair_marks.py``, within the
per-forward budget: :func:`~kv_repair_marks.plan_rows`): the same ``req_to_token``
slots, the tokens one position ahead (the host's draft-extend layout: position ``p``
reads token ``p + 1``; the last one is the step's bonus token), like the host's draft
extend after a chunked prefill. The draft's top-k at each request's last position
replaces the zeroed top-k, so the step already drafts warm. Requests without a mark
ride along with their last position only (recomputed, unchanged), which keeps the batch
whole for the host's sampling info.

:func:`prepare_repair` builds everything that needs no collective and returns the
forward, which the hook before ``EagleDraftWorker.draft`` (``kv_repair.py``) runs once
every TP rank could prepare it. :func:`repairing` tells the draft runner's forwards of
a repair apart from those of draft steps (HYBRID's confidence).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from sglang_spec_ext.sglang.model_drafts import kv_repair_marks as marks


def _repair(draft_worker: Any, batch: Any, stale: list[int | None]) -> None:
    """Prepare and run the repair forward (one rank, or a test)."""
    prepare_repair(draft_worker, batch, stale)()


def prepare_repair(draft_worker: Any, batch: Any, stale: list[int | None]) -> Callable[[], None]:
    """Everything of the repair that needs no collective (the extend batch, its
    inputs); returns the forward and what follows it, to run once the ranks agree."""
    import copy

    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    reqs = batch.reqs
    seq_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens.cpu()
    seq_lens = [int(x) for x in seq_cpu.tolist()]
    starts, counts, clears = marks.plan_rows(
        stale, seq_lens, [marks.known_len(r) for r in reqs], marks.STATS.max_tokens
    )
    device = batch.seq_lens.device
    # Row r of request i sits at position starts[i] + r and reads token position + 1;
    # the last row's token (position seq_len) is the step's bonus token, on the device.
    flat: list[int] = []
    for i, req in enumerate(reqs):
        flat.extend(marks.token_slice(req, starts[i] + 1, seq_lens[i]))
        flat.append(0)
    input_ids = torch.tensor(flat, dtype=torch.int64, device=device)
    ends = torch.tensor(counts, dtype=torch.int64).cumsum(0) - 1
    draft_input = batch.spec_info
    input_ids[ends.to(device)] = draft_input.bonus_tokens.to(torch.int64)
    pool_rows = torch.repeat_interleave(
        batch.req_pool_indices.to(torch.int64), torch.tensor(counts, device=device)
    )
    cols = torch.cat(
        [torch.arange(s, s + c, dtype=torch.int64) for s, c in zip(starts, counts, strict=True)]
    )
    out_cache_loc = draft_worker.req_to_token_pool.req_to_token[pool_rows, cols.to(device)]

    ext = copy.copy(batch)
    ext.forward_mode = ForwardMode.EXTEND
    ext.input_ids = input_ids
    ext.out_cache_loc = out_cache_loc.to(torch.int64)
    ext.prefix_lens = starts
    ext.extend_lens = counts
    ext.extend_num_tokens = len(flat)
    ext.extend_logprob_start_lens = list(counts)
    ext.return_logprob = False
    ext.extend_input_logprob_token_ids = None
    ext.is_extend_in_batch = True
    ext.seq_lens_cpu = torch.tensor(seq_lens, dtype=seq_cpu.dtype)
    ext.seq_lens_sum = sum(seq_lens)
    ext.spec_info = EagleDraftExtendInput(
        hidden_states=None, num_tokens_per_req=1, num_tokens_for_logprob_per_req=1
    )
    forward_batch = ForwardBatch.init_new(
        ext,
        draft_worker.draft_runner,
        capture_hidden_mode=CaptureHiddenMode.NULL,
        return_hidden_states_before_norm=False,
    )
    forward_batch.return_logprob = False
    return functools.partial(
        _run_repair, draft_worker, batch, forward_batch, stale, starts, counts, clears
    )


_REPAIRING = [False]  # a repair forward is running (see repairing())


def repairing() -> bool:
    """Whether the draft runner's forward running now is a repair forward, not a draft
    step (HYBRID reads its draft steps' confidence from that forward's logits)."""
    return _REPAIRING[0]


@contextlib.contextmanager
def _repair_forward() -> Iterator[None]:
    _REPAIRING[0] = True
    try:
        yield
    finally:
        _REPAIRING[0] = False


def _run_repair(
    draft_worker: Any,
    batch: Any,
    forward_batch: Any,
    stale: list[int | None],
    starts: list[int],
    counts: list[int],
    clears: list[bool],
) -> None:
    """The repair's draft forward and its top-k, then the marks and counters."""
    from sglang.srt.speculative import eagle_worker_v2 as host

    reqs = batch.reqs
    draft_input = batch.spec_info
    with _repair_forward():
        logits = draft_worker.draft_runner.forward(forward_batch).logits_output.next_token_logits
    use_rs = host.get_spec().speculative_use_rejection_sampling
    if use_rs or draft_worker.topk > 1:
        probs = host.renorm_draft_probs(logits, batch.sampling_info, use_rs)
    if use_rs:
        topk_p, topk_index = host.fast_sample(
            probs, num_samples=1, sampling_seed=batch.sampling_info.sampling_seed,
            positions=batch.seq_lens,
        )  # fmt: skip
        draft_input.draft_probs = probs
    elif draft_worker.topk == 1:  # as the host's draft extend for decode: argmax, p = 1
        topk_index = torch.argmax(logits, dim=-1, keepdim=True)
        topk_p = torch.ones_like(topk_index, dtype=torch.float32)
    else:
        topk_p, topk_index = host.fast_topk(probs, draft_worker.topk, dim=-1)
    draft_input.topk_p = topk_p.to(draft_input.topk_p.dtype)
    draft_input.topk_index = topk_index.to(draft_input.topk_index.dtype)
    stats = marks.STATS
    marked = [i for i, s in enumerate(stale) if s is not None]
    for i in marked:
        if clears[i]:
            setattr(reqs[i], marks.STALE_ATTR, None)
            stats.requests += 1
            stats.tokens += counts[i]
            stats.truncated += int(starts[i] > stale[i])
        else:
            stats.deferred += 1
    stats.unwritten_tokens = stats.unwritten_requests = 0  # deferred ones: a step's worth
    stats.repairs += 1
    stats.maybe_log()
