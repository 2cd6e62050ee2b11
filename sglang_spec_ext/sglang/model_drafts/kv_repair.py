"""Draft-KV repair: zero draft steps as plain decoding without the cold recovery.

At zero draft steps (the adaptive controller's choice at large batches) SGLang 0.5.23
still runs the draft model's extend after each one-token verify, to keep the draft KV
cache warm for when the batch shrinks. ``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1``
skips it, which makes zero steps plain decoding, but a request that later drafts again
does so from zeroed top-k and a draft KV cache with holes ("cold recovery"; measured by
``benchmarks/cold_recovery_smollm2.py``: a quarter of the accepted drafts lost).

``SGLANG_SPEC_EXT_DRAFT_KV_REPAIR=1`` (STANDALONE drafts, and HYBRID with a STANDALONE
draft) sets the host's skip flag and fills the holes when they matter. This module holds
the hooks and their installation; the bookkeeping of what is missing (marks, counters,
the rows a repair recomputes) is ``kv_repair_marks.py``, the rebuild forward
``kv_repair_forward.py``:

* a hook after the host's ``EAGLEWorkerV2._stub_skipped_draft_extend`` marks each
  request of a skipped step with the first draft-KV position it left unwritten (the
  request's committed length as the scheduler knows it, less the tokens one overlapped
  step can add, so the mark is never late: recomputing a valid position rewrites the
  same KV);
* a hook before ``EagleDraftWorker.draft`` (a step with draft steps > 0) finds the
  marked requests and runs the draft model once in EXTEND mode over each one's
  unwritten positions (``kv_repair_forward.py``: the same ``req_to_token`` slots, the
  tokens one position ahead, like the host's draft extend after a chunked prefill). The
  draft's top-k at each request's last position replaces the zeroed top-k, so this
  step already drafts warm;
* an AROUND hook on ``EagleDraftWorker._draft_extend_for_prefill`` defers the draft's
  prefill extend of new requests while the worker is at zero steps: each request is
  marked from its first prefilled position and the next draft input carries the
  target's first token with zeroed top-k (as after a skipped zero-step extend), so a
  server at zero steps runs no draft forward at all (with ``plain_step.py``, zero steps
  are plain decoding).

One prefill-shaped draft forward per upshift replaces one decode-shaped draft forward
per zero step. The goodput controller knows: it prices probes up from zero steps with
the rebuild (``AdaptiveController.expect_repairs``: the draft's prior extend time of the
tokens the hooks count as unwritten, ``kv_repair_marks.RepairStats.unwritten_tokens``,
scaled by what measured repairs took) and splits the time of a step with a repair
between the step and the repair (``step_policy.py`` reads ``kv_repair_marks.STATS``).

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

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from sglang_spec_ext.sglang.model_drafts import kv_repair_forward as rebuild
from sglang_spec_ext.sglang.model_drafts import kv_repair_marks as marks

logger = logging.getLogger("sglang_spec_ext")

SKIP_ZERO_STEP_ENV = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
STUB_TARGET = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._stub_skipped_draft_extend"
DRAFT_TARGET = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft"
PREFILL_EXTEND_TARGET = (
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill"
)


def _mark_skipped(result: Any, worker: Any, batch: Any, *_a: Any, **_k: Any) -> None:
    """After a skipped zero-step draft extend: mark each request's first unwritten position."""
    stats = marks.STATS
    if not stats.enabled or batch.forward_mode.is_idle():
        return None
    lens = batch.seq_lens_cpu.tolist() if batch.seq_lens_cpu is not None else None
    # Without CPU lengths (overlap), one step may have committed up to
    # --speculative-num-steps + 1 tokens the scheduler has not seen yet; marking earlier
    # than needed only recomputes valid positions.
    lag = 0 if lens is not None else max_steps() + 1
    tokens = 0
    for i, req in enumerate(batch.reqs):
        mark = getattr(req, marks.STALE_ATTR, None)
        if mark is None:
            known = marks.known_len(req) - 1
            at = int(lens[i]) if lens is not None else known - lag
            mark = max(0, min(at, known))
            setattr(req, marks.STALE_ATTR, mark)
        tokens += max(0, marks.known_len(req) - mark)
    stats.unwritten_tokens = min(tokens, stats.max_tokens)
    stats.unwritten_requests = len(batch.reqs)
    stats.marked_steps += 1
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
    stats = marks.STATS
    mm_embeds = args[2] if len(args) > 2 else kwargs.get("mm_input_embeds")
    if (
        not stats.enabled
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
        mark = getattr(req, marks.STALE_ATTR, None)
        setattr(req, marks.STALE_ATTR, int(start) if mark is None else min(mark, int(start)))
        tokens += int(length)
    stats.deferred_prefills += 1
    stats.unwritten_tokens = min(stats.unwritten_tokens + tokens, stats.max_tokens)
    stats.unwritten_requests += len(batch.reqs)
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
    stats = marks.STATS
    reqs = batch.reqs
    stale = [getattr(r, marks.STALE_ATTR, None) for r in reqs]
    if all(s is None for s in stale):
        stats.unwritten_tokens = stats.unwritten_requests = 0  # drafting, nothing skipped
        return None
    if not repairable(draft_worker):
        return None
    sync = _tp()
    if not stats.enabled and sync is None:
        return None
    run = None
    if stats.enabled:
        try:
            run = rebuild.prepare_repair(draft_worker, batch, stale)
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
    stats = marks.STATS
    if stats.enabled:
        stats.failures += 1
    stats.enabled = False
    stats.unwritten_tokens = stats.unwritten_requests = 0
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
    marks.STATS.max_tokens = int(max_tokens)
    marks.STATS.log_interval_s = float(log_interval_s)
    register_hooks_once(
        [
            (STUB_TARGET, _mark_skipped, HookType.AFTER),
            (DRAFT_TARGET, _repair_before_draft, HookType.BEFORE),
            (PREFILL_EXTEND_TARGET, _defer_prefill_extend, HookType.AROUND),
        ]
    )
    return ["draft_kv_repair"]
