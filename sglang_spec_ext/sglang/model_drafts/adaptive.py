"""The goodput controller for model drafts: EAGLE, EAGLE3, STANDALONE, HYBRID and MTP.

``SGLANG_SPEC_EXT_ADAPTIVE=1`` with ``--speculative-algorithm EAGLE | EAGLE3 |
STANDALONE | HYBRID | NEXTN`` (the host resolves NEXTN to EAGLE; the target's own MTP
layer drafts, priced with the MTP preset: :func:`is_mtp_draft`), chains (topk 1) and trees (topk > 1: each step count verifies
the candidates it can produce, :func:`tree_verify_widths`). The host already keeps one runtime state per draft
step count for its own adaptive EAGLE (``adaptive_runtime_state.AdaptiveController``:
draft and verify attention backends and CUDA graphs per step count, swapped before a
decode step); its decision policy is a protocol (``AdaptiveSpecPolicy``). We plug our
controller in as that policy, so step counts switch through the host's own runtime
states, never eagerly:

* a ``HookRegistry`` hook on ``EAGLEWorkerV2.init_cuda_graphs`` (inherited by
  ``StandaloneWorkerV2`` and our HYBRID workers) attaches the host's controller with
  :class:`GoodputStepPolicy` before the host builds its states, one per step count
  ``0..--speculative-num-steps`` (STANDALONE and HYBRID, which the host leaves without
  adaptive steps, get them the same way);
* before each decode step the host asks the policy for the step count of the batch
  size at hand (``get_steps_for_batch``): :meth:`GoodputStepPolicy.get_steps_for_batch`
  returns the controller's choice (``adaptive.AdaptiveController`` with chain
  acceptance per draft depth, ``adaptive/chain.py``);
* after each verify the host reports the accepted drafts per request
  (``on_verify_complete``); the step time fed to the cost model is the wall time
  between two consecutive decode steps of the same batch size with no prefill between
  them (a hook on ``_forward_prefill_batch`` marks prefills). Under overlap scheduling
  the accepted counts of a step arrive after the next step started; decisions are
  matched to reports in order;
* with ``--tp-size`` > 1 each rank's clock differs, so only the first TP rank's
  controller decides and the others take its step count (``tp_sync.TpSync.choice``,
  one int64 over the TP group's gloo group per decode step): every rank switches draft
  steps, verify width and graphs together.

Zero steps is the host's own zero-step path (a one-token verify). The host runs the
draft extend there to keep the draft KV cache warm unless
``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1``; the cost model's prior follows that
setting; with ``SGLANG_SPEC_EXT_DRAFT_KV_REPAIR=1`` (``sglang/model_drafts/kv_repair.py``) the
extend is skipped and rebuilt when a request drafts again, and the controller prices
that rebuild into probes up from zero steps. The prior is the draft kind's preset with
the served models' sizes read from the host's model runners (weights, KV bytes per
token; a CPU's device constants on the CPU engine) unless the user sets cost constants;
calibration on the running server does the rest.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from sglang_spec_ext.adaptive import AdaptiveConfig, AdaptiveController
from sglang_spec_ext.adaptive.config import CHAIN_DEFAULTS
from sglang_spec_ext.adaptive.prior import (
    PRESETS,
    SIZED_FIELDS,
    ModelSizes,
    draft_extend_time,
    sized_prior,
)
from sglang_spec_ext.sglang.model_drafts.kv_repair import STATS as REPAIR_STATS
from sglang_spec_ext.sglang.model_drafts.kv_repair import announce_repair
from sglang_spec_ext.sglang.serving import metrics as spec_metrics
from sglang_spec_ext.sglang.workers.tp_sync import TpSync, tp_sync_or_none

logger = logging.getLogger("sglang_spec_ext")

INIT_TARGET = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.init_cuda_graphs"
PREFILL_TARGET = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._forward_prefill_batch"
#: Log line prefix; what follows is {batch-size tier: {draft steps: decode steps}} since
#: the previous line.
STEPS_LOG_MARK = "sglang-spec-ext adaptive steps per batch-size tier since the last line: "
SKIP_ZERO_STEP_ENV = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
#: Decisions kept waiting for their verify report (overlap keeps one in flight).
MAX_PENDING = 8
#: Cost-model prior by draft kind, unless the user names one.
KIND_PRESETS = {
    "eagle": "llama3-8b-h100-eagle3",
    "eagle3": "llama3-8b-h100-eagle3",
    "mtp": "llama3-8b-h100-mtp",
    "standalone": "llama3-8b-h100-standalone-1b",
}


class AdaptiveStepsError(ValueError):
    """The adaptive controller cannot drive this server configuration."""


class GoodputStepPolicy:
    """The host's ``AdaptiveSpecPolicy`` protocol, answered by our controller."""

    #: Read by the metrics' verify hook (``serving/metrics.py``): each request's step
    #: count is ours to report.
    spec_ext_step_policy = True

    def __init__(
        self,
        controller: AdaptiveController,
        *,
        clock: Callable[[], float] = time.perf_counter,
        log_interval_s: float = 30.0,
        tp: TpSync | None = None,
    ) -> None:
        self.controller = controller
        self._clock = clock
        self._tp = tp  # TP > 1: the first rank decides, the others take its choice
        self._cuda_graph_bs: list[int] | None = None
        # (bs, steps) awaiting a report; overlap keeps one in flight, the bound drops stale ones
        self._pending: deque[tuple[int, int]] = deque(maxlen=MAX_PENDING)
        self._last: tuple[int, int, float] | None = None  # (bs, steps, start) of the last step
        self._log_interval_s = log_interval_s
        self._logged_at = clock()
        self._used: dict[int, Counter[int]] = {}
        self._repairs_seen = (0, 0, 0)  # draft-KV (repairs, requests, tokens) at the last step

    # -- host protocol -------------------------------------------------------------
    @property
    def candidate_steps(self) -> list[int]:
        return [int(k) for k in self.controller.ks]

    def set_cuda_graph_bs(self, cuda_graph_bs: list[int] | None) -> None:
        self._cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None:
        # every step count can be chosen at every batch size
        return None if self._cuda_graph_bs is None else list(self._cuda_graph_bs)

    def get_steps_for_batch(self, batch_size: int) -> int:
        """Called by the host before each decode step: the step count to run."""
        now = self._clock()
        bs = int(batch_size)
        # a step that rebuilt skipped draft KV (draft_kv_repair) did more than its steps:
        # the controller splits its time between the two
        seen = self._repairs_seen
        self._repairs_seen = (REPAIR_STATS.repairs, REPAIR_STATS.requests, REPAIR_STATS.tokens)
        if self._last is not None:
            last_bs, last_k, start = self._last
            if self._repairs_seen != seen:
                if last_bs == bs:
                    reqs = self._repairs_seen[1] - seen[1]
                    tokens = self._repairs_seen[2] - seen[2]
                    self.controller.observe_repair_step(bs, last_k, now - start, tokens, reqs)
            elif last_bs == bs:
                self.controller.observe_step_time(bs, last_k, now - start)
        if bs < 1:  # an idle batch: nothing to decide
            self._last = None
            return self.candidate_steps[0]
        # what a repair would rebuild now (0 without the repair)
        self.controller.note_unwritten(
            REPAIR_STATS.unwritten_tokens, REPAIR_STATS.unwritten_requests
        )
        steps = self._decide(bs)
        self._last = (bs, steps, now)
        self._pending.append((bs, steps))
        self._count(bs, steps, now)
        return steps

    def on_verify_complete(self, num_correct_drafts_per_req: list[int], batch_size: int) -> None:
        """Called by the host after each decode verify; switching happens at the next
        ``get_steps_for_batch``, so this never asks for one (returns ``None``)."""
        if not self._pending:
            return None
        bs, steps = self._pending.popleft()
        accepted = [int(a) for a in num_correct_drafts_per_req]
        if len(accepted) != bs:  # a report that does not match the decision: skip it
            return None
        self.controller.on_verify(bs, steps, accepted)
        return None

    # -- ours -----------------------------------------------------------------------
    def _decide(self, bs: int) -> int:
        """The step count of this decode step, the same on every TP rank: the first
        rank's controller decides from its own clock and the others take its choice (a
        rank-local choice would switch draft steps, verify width and graphs on one rank
        only: mismatched collectives). Every rank calls this once per decode step, in
        the lockstep order of the TP schedulers."""
        if self._tp is None:
            return int(self.controller.choose_k(bs))
        steps = int(self.controller.choose_k(bs)) if self._tp.is_src else -1
        return self._tp.choice(steps)

    def note_prefill(self) -> None:
        """A prefill ran: the time since the last decode step is not a step time."""
        self._last = None

    def _count(self, bs: int, steps: int, now: float) -> None:
        """Count the choice; every ``log_interval_s`` log the counts since the last line."""
        tier = int(self.controller.policy.tiers[self.controller.policy.tier_index(bs)])
        self._used.setdefault(tier, Counter())[steps] += 1
        spec_metrics.on_adaptive_step("steps", self.controller, bs, steps)
        if now - self._logged_at >= self._log_interval_s:
            self._logged_at = now
            counts = {t: dict(sorted(c.items())) for t, c in sorted(self._used.items())}
            logger.info("%s%s", STEPS_LOG_MARK, counts)
            self._used.clear()


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


def controller_config(
    kind: str,
    max_steps: int,
    verify_widths: tuple[int, ...] | None = None,
    sizes: ModelSizes | None = None,
) -> AdaptiveConfig:
    """The controller config for a model draft of ``kind`` with at most ``max_steps``
    (``verify_widths``: tree drafts, the verify width per step count; ``sizes``: the
    served models, which replace the preset's where the user set no cost constants)."""
    from sglang_spec_ext.config import adaptive_config
    from sglang_spec_ext.sglang.serving.server_args import plugin_config

    config = plugin_config()
    options = dict(config.adaptive_options)
    cfg = adaptive_config(config, max_k=max_steps)
    overrides: dict[str, Any] = {k: v for k, v in CHAIN_DEFAULTS.items() if k not in options}
    if "candidate_ks" not in options:  # chains: every step count up to the startup one
        overrides["candidate_ks"] = tuple(range(0, max_steps + 1))
    if "cost_preset" not in options:
        overrides["cost_preset"] = KIND_PRESETS.get(kind, KIND_PRESETS["standalone"])
        if sizes is not None and not any("cost_" + n in options for n in SIZED_FIELDS):
            sized = sized_prior(PRESETS[overrides["cost_preset"]], sizes)
            for name in SIZED_FIELDS:
                overrides["cost_" + name] = getattr(sized, name)
    if verify_widths is not None:
        overrides["verify_widths"] = verify_widths
    if "cost_zero_step_draft" not in options:
        skip = os.environ.get(SKIP_ZERO_STEP_ENV, "").lower() in ("1", "true", "yes")
        overrides["cost_zero_step_draft"] = 0.0 if skip else 1.0
    return dataclasses.replace(cfg, **overrides)


def worker_kind(worker: Any) -> str:
    """``eagle`` / ``eagle3`` / ``mtp`` / ``standalone`` for a host model-draft worker
    (``mtp``: the EAGLE path running the target's own MTP layer, :func:`is_mtp_draft`)."""
    algo = getattr(worker, "speculative_algorithm", None)
    if algo is not None and algo.is_standalone():
        return "standalone"
    if algo is not None and algo.is_eagle3():
        return "eagle3"
    return "mtp" if is_mtp_draft(worker) else "eagle"


def is_mtp_draft(worker: Any) -> bool:
    """Whether the draft runner runs the target's own MTP layer (``--speculative-algorithm
    NEXTN``, or EAGLE on an MTP checkpoint, with or without a draft path): its
    architecture is the host's MTP draft class for the target's config (``MiMoForCausalLM``
    -> ``MiMoMTP``, ``DeepseekV3ForCausalLM`` -> ``DeepseekV3ForCausalLMNextN``, ...).
    False where a runner is not where SGLang 0.5.23 keeps it."""
    from sglang_spec_ext.sglang.model_drafts.draft_kind import mtp_draft_architecture

    try:
        target = worker._target_worker.model_runner.model_config.hf_config
        draft = worker._draft_worker.draft_runner.model_config.hf_config
    except AttributeError:
        return False
    mtp = mtp_draft_architecture(target)
    return mtp is not None and mtp in (getattr(draft, "architectures", None) or [])


def _runner_sizes(runner: Any) -> tuple[float, float, float]:
    """(parameters, weight bytes, KV bytes per token) of one host model runner."""
    params = nbytes = 0.0
    for p in runner.model.parameters():
        params += p.numel()
        nbytes += p.numel() * p.element_size()
    mc = runner.model_config
    kv_heads = mc.get_num_kv_heads(int(getattr(runner, "tp_size", 1) or 1))
    itemsize = getattr(getattr(runner, "kv_cache_dtype", None), "itemsize", None) or 2
    kv = float(mc.num_attention_layers * kv_heads * mc.head_dim * 2 * itemsize)
    return params, nbytes, kv


def _size(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def model_sizes(worker: Any) -> ModelSizes | None:
    """The served target's and draft's sizes, read from the host's model runners;
    ``None`` (the preset stays) where a runner is not where SGLang 0.5.23 keeps it."""
    try:
        target = worker._target_worker.model_runner
        draft = worker._draft_worker.draft_runner
        t_params, t_bytes, t_kv = _runner_sizes(target)
        d_params, d_bytes, d_kv = _runner_sizes(draft)
        device = str(getattr(target, "device", "cuda"))
    except Exception as exc:  # noqa: BLE001 - a missing attribute must not stop the server
        logger.warning("sglang-spec-ext: model sizes unavailable (%s); preset cost prior", exc)
        return None
    return ModelSizes(device, t_params, t_bytes, t_kv, d_params, d_bytes, d_kv)


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
    sized = "" if sizes is None else (
        f" with the served models' sizes (target {_size(sizes.target_bytes)}, draft "
        f"{_size(sizes.draft_bytes)}{', CPU device constants' if sizes.device == 'cpu' else ''})"
    )  # fmt: skip
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
