"""Draft-KV repair: zero draft steps as plain decoding without the cold recovery.

At zero draft steps (the adaptive controller's choice at large batches) SGLang 0.5.23
still runs the draft model's extend after each one-token verify, to keep the draft KV
cache warm for when the batch shrinks. ``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1``
skips it, which makes zero steps plain decoding, but a request that later drafts again
does so from zeroed top-k and a draft KV cache with holes ("cold recovery"; measured by
``benchmarks/cold_recovery_smollm2.py``: a quarter of the accepted drafts lost).

``SGLANG_SPEC_EXT_DRAFT_KV_REPAIR=1`` (STANDALONE drafts, and HYBRID with a STANDALONE
draft) sets the host's skip flag and fills the holes when they matter:

* a hook after the host's ``EAGLEWorkerV2._stub_skipped_draft_extend`` marks each
  request of a skipped step with the first draft-KV position it left unwritten (the
  request's committed length as the scheduler knows it, less the tokens one overlapped
  step can add, so the mark is never late: recomputing a valid position rewrites the
  same KV);
* a hook before ``EagleDraftWorker.draft`` (a step with draft steps > 0) finds the
  marked requests and runs the draft model once in EXTEND mode over each one's
  unwritten positions: the same ``req_to_token`` slots, the tokens one position ahead
  (the host's draft-extend layout: position ``p`` reads token ``p + 1``; the last one is
  the step's bonus token), like the host's draft extend after a chunked prefill. The
  draft's top-k at each request's last position replaces the zeroed top-k, so this
  step already drafts warm. Requests without a mark ride along with their last
  position only (recomputed, unchanged), which keeps the batch whole for the host's
  sampling info.

* an AROUND hook on ``EagleDraftWorker._draft_extend_for_prefill`` defers the draft's
  prefill extend of new requests while the worker is at zero steps: each request is
  marked from its first prefilled position and the next draft input carries the
  target's first token with zeroed top-k (as after a skipped zero-step extend), so a
  server at zero steps runs no draft forward at all (with ``plain_step.py``, zero steps
  are plain decoding).

One prefill-shaped draft forward per upshift replaces one decode-shaped draft forward
per zero step. The goodput controller knows: it prices probes up from zero steps with
the rebuild (``AdaptiveController.expect_repairs``: the draft's prior extend time of the
tokens this module counts as unwritten, :attr:`RepairStats.unwritten_tokens`, scaled by
what measured repairs took) and splits the time of a step with a repair between the
step and the repair (``sglang/model_drafts/adaptive.py`` reads :data:`STATS`).

The repair is bounded: at most ``SGLANG_SPEC_EXT_DRAFT_KV_REPAIR_MAX_TOKENS`` tokens per
forward, split over the marked requests (older holes stay, as with the
host's skip). Requests whose committed tokens the scheduler has not seen yet (overlap
scheduling) keep their mark for the next step. The repair only ever writes draft KV
and draft top-k, so it cannot change outputs (the target verifies every draft); a
failure is logged, the repair switches off, and the server goes on with the host's
cold recovery. EAGLE and EAGLE3 drafts cannot be repaired this way (their draft reads
the target's hidden states of the skipped tokens, which are gone).

Not covered: draft KV of radix-cache prefixes written while skipped (a new request that
reuses such a prefix inherits its holes, as with the host's flag alone).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from sglang_spec_ext.sglang.serving import metrics as spec_metrics

logger = logging.getLogger("sglang_spec_ext")

SKIP_ZERO_STEP_ENV = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
STUB_TARGET = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._stub_skipped_draft_extend"
DRAFT_TARGET = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft"
PREFILL_EXTEND_TARGET = (
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill"
)
#: Attribute on a host ``Req``: first draft-KV position a skipped step left unwritten.
STALE_ATTR = "_spec_ext_draft_kv_stale_from"
#: Log line prefix of the repair counters (JSON-free: ``key=value`` pairs).
STATS_LOG_MARK = "sglang-spec-ext draft-KV repair: "


class RepairStats:
    """Counters of this process's repairs (read by tests and the stats log line)."""

    def __init__(self) -> None:
        self.marked_steps = 0
        self.deferred_prefills = 0  # prefill draft extends skipped at zero steps
        self.repairs = 0
        self.requests = 0
        self.tokens = 0
        self.deferred = 0
        self.truncated = 0
        self.failures = 0
        # gauge: draft KV the next repair would rebuild (tokens, capped at max_tokens;
        # requests), as of the last skipped step; what the controller prices
        self.unwritten_tokens = 0
        self.unwritten_requests = 0
        self.enabled = True
        self.max_tokens = 8192
        self.log_interval_s = 30.0
        self._last_log: float | None = None

    def maybe_log(self) -> None:
        """An INFO line with the counters: the first repair, then at most one per interval."""
        now = time.monotonic()
        if self._last_log is None or now - self._last_log >= self.log_interval_s:
            self._last_log = now
            logger.info("%s", self.line())
            spec_metrics.publish_repairs(self)

    def line(self) -> str:
        return STATS_LOG_MARK + " ".join(
            f"{k}={getattr(self, k)}"
            for k in (
                "repairs",
                "requests",
                "tokens",
                "deferred",
                "truncated",
                "failures",
                "deferred_prefills",
            )  # fmt: skip
        )


STATS = RepairStats()


def known_len(req: Any) -> int:
    """How many committed tokens the scheduler knows of the request (prompt + output)."""
    return len(req.origin_input_ids) + len(req.output_ids)


def token_slice(req: Any, lo: int, hi: int) -> list[int]:
    """Committed tokens ``lo..hi-1`` of the request (positions), without copying the rest."""
    prompt, output = req.origin_input_ids, req.output_ids
    n = len(prompt)
    head = list(prompt[lo:hi]) if lo < n else []
    return head + list(output[max(lo - n, 0) : max(hi - n, 0)])


def _mark_skipped(result: Any, worker: Any, batch: Any, *_a: Any, **_k: Any) -> None:
    """After a skipped zero-step draft extend: mark each request's first unwritten position."""
    if not STATS.enabled or batch.forward_mode.is_idle():
        return None
    lens = batch.seq_lens_cpu.tolist() if batch.seq_lens_cpu is not None else None
    # Without CPU lengths (overlap), one step may have committed up to
    # --speculative-num-steps + 1 tokens the scheduler has not seen yet; marking earlier
    # than needed only recomputes valid positions.
    lag = 0 if lens is not None else max_steps() + 1
    tokens = 0
    for i, req in enumerate(batch.reqs):
        mark = getattr(req, STALE_ATTR, None)
        if mark is None:
            known = known_len(req) - 1
            at = int(lens[i]) if lens is not None else known - lag
            mark = max(0, min(at, known))
            setattr(req, STALE_ATTR, mark)
        tokens += max(0, known_len(req) - mark)
    STATS.unwritten_tokens = min(tokens, STATS.max_tokens)
    STATS.unwritten_requests = len(batch.reqs)
    STATS.marked_steps += 1
    return None


def _defer_prefill_extend(
    original: Callable[..., Any], draft_worker: Any, batch: Any, *args: Any, **kwargs: Any
) -> Any:
    """AROUND ``EagleDraftWorker._draft_extend_for_prefill``: at zero draft steps the
    draft's prefill extend is skipped too (a server at zero steps runs no draft forward
    at all); each request is marked from its first prefilled position, so the repair
    rebuilds that draft KV with the rest when the request drafts again. The next draft
    input carries the target's first token and zeroed top-k, as after a skipped
    zero-step draft extend."""
    mm_embeds = args[2] if len(args) > 2 else kwargs.get("mm_input_embeds")
    if (
        not STATS.enabled
        or getattr(draft_worker, "speculative_num_steps", 1) != 0
        or batch.forward_mode.is_idle()
        or mm_embeds is not None
        or not repairable(draft_worker)
        or _rejection_sampling()
    ):
        return original(draft_worker, batch, *args, **kwargs)
    next_token_ids = args[1] if len(args) > 1 else kwargs["next_token_ids"]
    tokens = 0
    for req, start, length in zip(batch.reqs, batch.prefix_lens, batch.extend_lens, strict=True):
        mark = getattr(req, STALE_ATTR, None)
        setattr(req, STALE_ATTR, int(start) if mark is None else min(mark, int(start)))
        tokens += int(length)
    STATS.deferred_prefills += 1
    STATS.unwritten_tokens = min(STATS.unwritten_tokens + tokens, STATS.max_tokens)
    STATS.unwritten_requests += len(batch.reqs)
    return _stub_draft_input(draft_worker, len(batch.reqs), next_token_ids)


def _rejection_sampling() -> bool:
    from sglang.srt.runtime_context import get_spec

    return bool(get_spec().speculative_use_rejection_sampling)


def _stub_draft_input(draft_worker: Any, bs: int, next_token_ids: torch.Tensor) -> Any:
    """A next draft input with zeroed top-k (the host's own stub after a skipped
    zero-step draft extend, ``_stub_skipped_draft_extend``) and the target's tokens."""
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.eagle_utils import get_draft_recurrent_hidden_state_spec

    device = next_token_ids.device
    hidden_size, hidden_dtype = get_draft_recurrent_hidden_state_spec(draft_worker.draft_runner)
    return EagleDraftInput(
        topk_p=torch.zeros((bs, draft_worker.topk), dtype=torch.float32, device=device),
        topk_index=torch.zeros((bs, draft_worker.topk), dtype=torch.int64, device=device),
        hidden_states=(
            None
            if hidden_size is None
            else torch.zeros((bs, hidden_size), dtype=hidden_dtype, device=device)
        ),
        bonus_tokens=next_token_ids,
        num_tokens_per_req=1,
        num_tokens_for_logprob_per_req=1,
    )


def max_steps() -> int:
    """The server's ``--speculative-num-steps`` (the largest step count of any state)."""
    try:
        from sglang.srt.runtime_context import get_spec

        return int(get_spec().speculative_num_steps)
    except Exception:  # noqa: BLE001 - no server context (tests): a generous bound
        return 8


def repairable(draft_worker: Any) -> bool:
    """Whether this draft worker's draft is a plain causal LM (STANDALONE kind)."""
    algo = getattr(draft_worker, "speculative_algorithm", None)
    return bool(algo is not None and algo.is_standalone())


def plan_rows(
    stale_from: list[int | None],
    seq_lens: list[int],
    known_lens: list[int],
    budget: int,
) -> tuple[list[int], list[int], list[bool]]:
    """Per request: first recomputed position, row count, and whether its mark clears.

    A marked request recomputes ``[stale_from, seq_len)`` (the last ``share`` positions
    of it where the budget, split evenly over marked requests, is smaller); an unmarked
    one its last position only. A request whose committed tokens up to ``seq_len - 1``
    are not known yet (overlap) gets its last position only and keeps its mark.
    """
    marked = [s is not None for s in stale_from]
    n_marked = sum(marked)
    share = max(1, budget // max(1, n_marked))
    starts, counts, clears = [], [], []
    for s, length, known in zip(stale_from, seq_lens, known_lens, strict=True):
        first = length - 1
        clear = False
        if s is not None and known >= length:
            first = max(min(s, length - 1), length - share, 0)
            clear = True
        starts.append(first)
        counts.append(length - first)
        clears.append(clear)
    return starts, counts, clears


def _repair_before_draft(draft_worker: Any, batch: Any, *_a: Any, **_k: Any) -> None:
    """Before a drafting step: rebuild the skipped draft KV of marked requests.

    With TP > 1 the repair forward has collectives of its own, so every rank runs it or
    none does: the ranks agree (:meth:`TpSync.all_ok`) after preparing the forward's
    inputs and before running it; a rank whose preparation failed, or that had switched
    the repair off, makes every rank skip it and switch it off. (Marks and batches are
    the same on every rank, so the agreement is reached on the same steps everywhere.)
    """
    if batch.forward_mode.is_idle():
        return None
    reqs = batch.reqs
    stale = [getattr(r, STALE_ATTR, None) for r in reqs]
    if all(s is None for s in stale):
        STATS.unwritten_tokens = STATS.unwritten_requests = 0  # drafting, nothing skipped
        return None
    if not repairable(draft_worker):
        return None
    sync = _tp()
    if not STATS.enabled and sync is None:
        return None
    run = None
    if STATS.enabled:
        try:
            run = _prepare_repair(draft_worker, batch, stale)
        except Exception:  # noqa: BLE001 - a repair must never take the server down
            _switch_off("preparing the repair forward failed")
    if sync is not None and not sync.all_ok(run is not None):
        if run is not None:
            _switch_off("another TP rank could not repair", log_traceback=False)
        return None
    if run is None:
        return None
    try:
        run()
    except Exception:  # noqa: BLE001 - a repair must never take the server down
        _switch_off("the repair forward failed")
    return None


def _switch_off(why: str, log_traceback: bool = True) -> None:
    if STATS.enabled:
        STATS.failures += 1
    STATS.enabled = False
    STATS.unwritten_tokens = STATS.unwritten_requests = 0
    (logger.exception if log_traceback else logger.error)(
        "sglang-spec-ext: draft-KV repair failed; switched off: %s (drafts after zero-step "
        "phases start cold, as with %s alone)",
        why,
        SKIP_ZERO_STEP_ENV,
    )


_SYNC: list[Any] = []  # [TpSync | None] once looked up


def _tp() -> Any:
    """This process's TP sync (None with one rank), looked up once."""
    if not _SYNC:
        from sglang_spec_ext.sglang.workers.tp_sync import tp_sync_or_none

        _SYNC.append(tp_sync_or_none())
    return _SYNC[0]


def _repair(draft_worker: Any, batch: Any, stale: list[int | None]) -> None:
    """Prepare and run the repair forward (one rank, or a test)."""
    _prepare_repair(draft_worker, batch, stale)()


def _prepare_repair(draft_worker: Any, batch: Any, stale: list[int | None]) -> Callable[[], None]:
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
    starts, counts, clears = plan_rows(
        stale, seq_lens, [known_len(r) for r in reqs], STATS.max_tokens
    )
    device = batch.seq_lens.device
    # Row r of request i sits at position starts[i] + r and reads token position + 1;
    # the last row's token (position seq_len) is the step's bonus token, on the device.
    flat: list[int] = []
    for i, req in enumerate(reqs):
        flat.extend(token_slice(req, starts[i] + 1, seq_lens[i]))
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
    marked = [i for i, s in enumerate(stale) if s is not None]
    for i in marked:
        if clears[i]:
            setattr(reqs[i], STALE_ATTR, None)
            STATS.requests += 1
            STATS.tokens += counts[i]
            STATS.truncated += int(starts[i] > stale[i])
        else:
            STATS.deferred += 1
    STATS.unwritten_tokens = STATS.unwritten_requests = 0  # deferred ones: a step's worth
    STATS.repairs += 1
    STATS.maybe_log()


class DraftKVRepairError(ValueError):
    """The draft-KV repair cannot serve this configuration."""


def announce_repair(kind: str, max_tokens: int) -> None:
    """At attach: refuse a draft the repair cannot rebuild, else log that it is on."""
    if kind != "standalone":
        raise DraftKVRepairError(
            f"SGLANG_SPEC_EXT_DRAFT_KV_REPAIR=1 with a {kind} draft: the repair rebuilds a "
            "plain causal-LM draft's KV (STANDALONE, or HYBRID with a STANDALONE draft); an "
            "EAGLE head needs the target's hidden states of the skipped tokens. Unset it"
        )
    logger.info(
        "sglang-spec-ext draft-KV repair on: zero steps skip the draft extend, a request "
        "that drafts again first rebuilds its skipped draft KV (at most %d tokens a forward)",
        max_tokens,
    )


def install_draft_kv_repair(max_tokens: int = 8192, log_interval_s: float = 30.0) -> list[str]:
    """Set the host's skip flag and register the two hooks (idempotent)."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    if os.environ.get(SKIP_ZERO_STEP_ENV, "1") not in ("1", "true", "True"):
        raise ValueError(
            f"SGLANG_SPEC_EXT_DRAFT_KV_REPAIR=1 with {SKIP_ZERO_STEP_ENV}="
            f"{os.environ[SKIP_ZERO_STEP_ENV]!r}: the repair replaces the zero-step draft "
            f"extend; unset {SKIP_ZERO_STEP_ENV} or set it to 1"
        )
    os.environ[SKIP_ZERO_STEP_ENV] = "1"
    STATS.max_tokens = int(max_tokens)
    STATS.log_interval_s = float(log_interval_s)
    register_hooks_once(
        [
            (STUB_TARGET, _mark_skipped, HookType.AFTER),
            (DRAFT_TARGET, _repair_before_draft, HookType.BEFORE),
            (PREFILL_EXTEND_TARGET, _defer_prefill_extend, HookType.AROUND),
        ]
    )
    return ["draft_kv_repair"]
