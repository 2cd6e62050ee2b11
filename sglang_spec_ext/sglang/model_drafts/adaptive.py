"""The goodput controller for model drafts: EAGLE, EAGLE3, STANDALONE, HYBRID and MTP.

``SGLANG_SPEC_EXT_ADAPTIVE=1`` with ``--speculative-algorithm EAGLE | EAGLE3 |
STANDALONE | HYBRID | NEXTN`` (the host resolves NEXTN to EAGLE; the target's own MTP
layer drafts, priced with the MTP preset: ``step_prior.is_mtp_draft``), chains (topk 1)
and trees (topk > 1: each step count verifies the candidates it can produce,
:func:`tree_verify_widths`). The host already keeps one runtime state per draft step
count for its own adaptive EAGLE (``adaptive_runtime_state.AdaptiveController``: draft
and verify attention backends and CUDA graphs per step count, swapped before a decode
step); its decision policy is a protocol (``AdaptiveSpecPolicy``). We plug our
controller in as that policy (``step_policy.GoodputStepPolicy``), so step counts switch
through the host's own runtime states, never eagerly. This module attaches it:

* a ``HookRegistry`` hook on ``EAGLEWorkerV2.init_cuda_graphs`` (inherited by
  ``StandaloneWorkerV2`` and our HYBRID workers) attaches the host's controller with
  our policy (:func:`attach`) before the host builds its states, one per step count
  ``0..--speculative-num-steps`` (STANDALONE and HYBRID, which the host leaves without
  adaptive steps, get them the same way; tree drafts build each state at its tree's
  verify width); ``SGLANG_SPEC_EXT_ADAPTIVE_POLICY=host-ema`` attaches the host's own
  EMA policy instead (:func:`host_ema_policy`);
* before each decode step the host asks the policy for the step count of the batch
  size at hand, after each verify it reports the accepted drafts per request
  (``step_policy.py``); a hook on ``_forward_prefill_batch`` tells the policy that a
  prefill ran (the time since the last decode step is no step time);
* with ``--tp-size`` > 1 each rank's clock differs, so only the first TP rank's
  controller decides and the others take its step count (``tp_sync.TpSync.choice``,
  one int64 over the TP group's gloo group per decode step): every rank switches draft
  steps, verify width and graphs together.

Zero steps is the host's own zero-step path (a one-token verify). The host runs the
draft extend there to keep the draft KV cache warm unless
``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1``; the cost model's prior follows that
setting; with ``SGLANG_SPEC_EXT_DRAFT_KV_REPAIR=1`` (``sglang/model_drafts/kv_repair.py``)
the extend is skipped and rebuilt when a request drafts again, and the controller prices
that rebuild into probes up from zero steps. The prior is the draft kind's preset with
the served models' sizes read from the host's model runners (weights, KV bytes per
token; a CPU's device constants on the CPU engine) unless the user sets cost constants
(``step_prior.py``); calibration on the running server does the rest.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

from sglang_spec_ext.adaptive import AdaptiveController
from sglang_spec_ext.adaptive.prior import draft_extend_time
from sglang_spec_ext.sglang.model_drafts.kv_repair import announce_repair
from sglang_spec_ext.sglang.model_drafts.step_policy import GoodputStepPolicy
from sglang_spec_ext.sglang.model_drafts.step_prior import (
    controller_config,
    model_sizes,
    sizes_note,
    worker_kind,
)
from sglang_spec_ext.sglang.workers.tp_sync import tp_sync_or_none

logger = logging.getLogger("sglang_spec_ext")

INIT_TARGET = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.init_cuda_graphs"
PREFILL_TARGET = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._forward_prefill_batch"


class AdaptiveStepsError(ValueError):
    """The adaptive controller cannot drive this server configuration."""


def tree_verify_widths(max_steps: int, topk: int, max_width: int) -> tuple[int, ...]:
    """Verify width (root included) per step count of a topk tree draft: all the
    candidates ``s`` steps can produce (``topk`` at depth 1, ``topk^2`` per deeper
    step), at most the startup ``--speculative-num-draft-tokens``; the startup step
    count keeps the startup width."""
    widths = [1]
    for s in range(1, max_steps + 1):
        widths.append(min(max_width, 1 + topk + (s - 1) * topk * topk))
    widths[max_steps] = max_width
    for s in range(1, max_steps + 1):  # the controller wants w(s) >= s + 1, non-decreasing
        widths[s] = max(widths[s], widths[s - 1], s + 1)
    return tuple(widths)


def _build_trees_at(worker: Any, widths: tuple[int, ...]) -> None:
    """The host builds each step count's runtime state with ``steps + 1`` verify tokens
    (its adaptive path is for chains); tree drafts need ``widths[steps]``."""
    build = worker.build_adaptive_runtime_state

    def build_tree_state(
        speculative_num_steps: int, speculative_num_draft_tokens: int, cuda_graph_bs: Any = None
    ) -> Any:
        return build(speculative_num_steps, widths[speculative_num_steps], cuda_graph_bs)

    worker.build_adaptive_runtime_state = build_tree_state


def attach(worker: Any) -> GoodputStepPolicy | None:
    """Give ``worker`` the host's adaptive controller with our policy, if configured.

    Called before the host builds its runtime states. ``None`` when the plugin's
    adaptive switch is off or this rank hosts no draft (pipeline stages before the last).
    """
    from sglang_spec_ext.sglang.serving.server_args import plugin_config

    config = plugin_config()
    if not config.adaptive or not getattr(worker, "_hosts_draft", True):
        return None
    if getattr(worker, "adaptive_controller", None) is not None:
        raise AdaptiveStepsError(
            "SGLANG_SPEC_EXT_ADAPTIVE=1 and --speculative-adaptive are both set: choose one "
            "controller (drop --speculative-adaptive for ours, or unset "
            "SGLANG_SPEC_EXT_ADAPTIVE for the host's EMA policy)"
        )
    max_steps = int(worker.speculative_num_steps)
    if max_steps < 1:
        raise AdaptiveStepsError(
            f"--speculative-num-steps {max_steps}: the adaptive controller needs at least 1"
        )
    topk = int(getattr(worker, "topk", 1))
    widths = None
    if topk > 1:
        if config.adaptive_policy == "host-ema":
            raise AdaptiveStepsError(
                f"SGLANG_SPEC_EXT_ADAPTIVE_POLICY=host-ema with --speculative-eagle-topk {topk}: "
                "the host's EMA policy drives chains (topk 1) only; use the goodput policy"
            )
        widths = tree_verify_widths(max_steps, topk, int(worker.speculative_num_draft_tokens))
        _build_trees_at(worker, widths)
    from sglang.srt.speculative.adaptive_runtime_state import (
        AdaptiveController as HostAdaptiveController,
    )

    kind = worker_kind(worker)
    if config.draft_kv_repair:
        announce_repair(kind, config.draft_kv_repair_max_tokens)
    if config.adaptive_policy == "host-ema":
        ema = host_ema_policy(max_steps)
        worker.adaptive_controller = HostAdaptiveController(worker, ema)
        logger.info(
            "sglang-spec-ext adaptive steps on %s (%s draft): the host's EMA policy, step "
            "counts %s (SGLANG_SPEC_EXT_ADAPTIVE_POLICY=host-ema)",
            type(worker).__name__,
            kind,
            ema.candidate_steps,
        )
        return ema
    sizes = model_sizes(worker)
    sized = sizes_note(sizes)
    policy = GoodputStepPolicy(
        AdaptiveController(controller_config(kind, max_steps, widths, sizes)),
        log_interval_s=config.stats_log_interval_s,
        tp=tp_sync_or_none(),
    )
    worker.adaptive_controller = HostAdaptiveController(worker, policy)
    if config.draft_kv_repair:
        prior = functools.partial(draft_extend_time, policy.controller.config.cost_params())
        policy.controller.expect_repairs(prior)
    pinned = policy.controller.config.pinned()
    logger.info(
        "sglang-spec-ext adaptive steps on %s (%s draft): step counts %s chosen per batch "
        "size from expected committed tokens per second (cost prior %s%s)%s",
        type(worker).__name__,
        kind,
        policy.candidate_steps,
        policy.controller.config.cost_preset,
        sized,
        f"; pinned (tier: steps) {pinned}" if pinned else "",
    )
    return policy


def host_ema_policy(max_steps: int) -> Any:
    """The host's own EMA policy (``AdaptiveSpeculativeParams``, its default tiers) with
    the step counts above ``max_steps`` dropped through its config-file interface (the
    runtime buffers are sized for ``--speculative-num-steps``)."""
    import json
    import tempfile

    from sglang.srt.speculative.adaptive_spec_params import (
        DEFAULT_ADAPTIVE_CONFIG,
        AdaptiveSpeculativeParams,
    )

    cfg = {}
    for bs, entry in DEFAULT_ADAPTIVE_CONFIG.items():
        steps = [s for s in entry["candidate_steps"] if s <= max_steps] or [max_steps]
        cfg[bs] = {**entry, "candidate_steps": steps}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    try:
        return AdaptiveSpeculativeParams(initial_steps=max_steps, cfg_path=f.name)
    finally:
        os.unlink(f.name)


def _init_cuda_graphs_hook(original: Callable[..., Any], worker: Any, *args: Any, **kw: Any) -> Any:
    attach(worker)
    return original(worker, *args, **kw)


def _prefill_hook(worker: Any, *args: Any, **kwargs: Any) -> None:
    policy = getattr(getattr(worker, "adaptive_controller", None), "params", None)
    if isinstance(policy, GoodputStepPolicy):
        policy.note_prefill()
    return None


def install_model_draft_adaptive() -> list[str]:
    """Register the two hooks (idempotent); return the installed name."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once(
        [
            (INIT_TARGET, _init_cuda_graphs_hook, HookType.AROUND),
            (PREFILL_TARGET, _prefill_hook, HookType.BEFORE),
        ]
    )
    return ["model_draft_adaptive"]
