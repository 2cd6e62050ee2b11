"""KV reserved per decode step for adaptive step counts, tree drafts included.

The host (SGLang 0.5.23) reserves each request's KV for the next decode step in the
scheduler, before the worker runs the step:

1. ``Scheduler.update_running_batch`` calls ``ScheduleBatch.check_decode_mem`` (through
   ``new_tokens_required_next_decode``) and ``prepare_for_decode``, which for model
   drafts is ``eagle_utils.eagle_prepare_for_decode``: each request gets KV up to
   ``kv_committed_len + get_alloc_reserve_per_decode()``, where the reserve is
   ``2 * get_alloc_len_per_decode()`` (``mem_cache/allocation_sizing.py``) and, at page
   size 1, ``get_alloc_len_per_decode() = max(steps * topk, W)``, ``steps`` read from
   the published config (``get_spec().speculative_num_steps``) and ``W`` from
   ``max_speculative_num_draft_tokens()`` (the start-up width, kept by the host for
   adaptive algorithms);
2. ``Scheduler.run_batch`` then calls ``EAGLEWorkerV2.forward_batch_generation``,
   whose first act is ``activate_step_by_batch``: the adaptive controller
   (``adaptive_runtime_state.AdaptiveController``) may switch to another step count,
   and ``apply_runtime_state`` writes the new ``speculative_num_steps`` into the
   config;
3. the draft (``eagle_worker_common.prepare_for_draft``) takes ``topk * steps`` slots
   per request from ``seq_lens`` on out of the request's row
   (``assign_draft_cache_locs_contiguous_func``).

So the reservation reads the step count of the state *before* the switch. The width
part is covered (the host keeps the start-up ``W``), the step part is not: for a chain
(topk 1) ``W >= steps + 1`` covers it, but for a tree ``topk * steps`` can exceed the
reserve taken at a lower step count (topk 4, steps 5, W 8: 16 slots reserved at one
step, 20 written at five), and the draft then writes through stale entries of its row,
slots that belong to other requests, at page size 1 (at page size > 1 the per-branch
page formula has the same ``steps`` in it).

Fix: the reservation always uses the largest step count this process's adaptive
controllers can switch to (the start-up count), whatever state is active:

* an AFTER hook on ``AdaptiveController.init_states`` records the largest step count
  among the states the controller built (and the start-up one);
* an AROUND hook on ``allocation_sizing.get_alloc_len_per_decode`` evaluates the host's
  own formula with ``speculative_num_steps`` raised to that count (a scoped override of
  the config bag, restored on return) when the active state has fewer steps.

The reserve is then the one the server was sized for at start-up (the KV pool, the
request-to-token rows and the host's ``check_decode_mem`` all use the start-up step
count), so nothing else changes; servers without an adaptive controller are untouched.
Installed with the goodput controller (``SGLANG_SPEC_EXT_ADAPTIVE=1``,
``sglang/host/hooks.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("sglang_spec_ext")

RESERVE_TARGET = "sglang.srt.mem_cache.allocation_sizing.get_alloc_len_per_decode"
STATES_TARGET = "sglang.srt.speculative.adaptive_runtime_state.AdaptiveController.init_states"

#: Largest step count any adaptive controller of this process can switch to (0: none).
_max_steps = 0


def reserve_steps() -> int:
    """The step count the per-step KV reservation is sized for (0: the active one)."""
    return _max_steps


def note_states(steps: list[int] | set[int] | tuple[int, ...]) -> int:
    """Record step counts an adaptive controller can switch to; return the maximum kept."""
    global _max_steps
    if steps:
        _max_steps = max(_max_steps, max(int(s) for s in steps))
    return _max_steps


def _reset() -> None:
    """Forget recorded step counts (tests)."""
    global _max_steps
    _max_steps = 0


def _states_hook(result: Any, controller: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``AdaptiveController.init_states``: remember its largest step count."""
    steps = set(int(s) for s in controller.candidate_steps)
    steps |= set(getattr(controller, "_states", {}))  # the registered start-up state
    worker_steps = getattr(controller.worker, "speculative_num_steps", None)
    if worker_steps is not None:
        steps.add(int(worker_steps))
    before = _max_steps
    kept = note_states(steps)
    if kept != before:
        logger.info(
            "sglang-spec-ext adaptive KV reserve: each decode step reserves KV for %d "
            "draft steps (the largest adaptive state), whatever state is active",
            kept,
        )
    return None


def _reserve_hook(original: Callable[..., int], *args: Any, **kwargs: Any) -> int:
    """AROUND ``get_alloc_len_per_decode``: the host's formula at the largest step count."""
    if _max_steps <= 0:
        return original(*args, **kwargs)
    from sglang.srt.runtime_context import get_spec

    spec = get_spec()
    active = spec.speculative_num_steps
    if active is None or int(active) >= _max_steps:
        return original(*args, **kwargs)
    with spec.override(speculative_num_steps=_max_steps):
        return original(*args, **kwargs)


def install_adaptive_kv_reserve() -> list[str]:
    """Register the two hooks (idempotent); return the installed name."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once(
        [
            (STATES_TARGET, _states_hook, HookType.AFTER),
            (RESERVE_TARGET, _reserve_hook, HookType.AROUND),
        ]
    )
    return ["adaptive_kv_reserve"]
