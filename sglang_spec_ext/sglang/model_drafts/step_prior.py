"""The goodput controller's configuration for a host model draft, and its cost prior.

Which kind of draft a host worker runs (:func:`worker_kind`: EAGLE, EAGLE3, the target's
own MTP layer, :func:`is_mtp_draft`, or a STANDALONE model) picks the cost model's preset
(:data:`KIND_PRESETS`) unless the user names one; the preset is sized to the served models
(weights, KV bytes per token, read from the host's model runners: :func:`model_sizes`; a
CPU's device constants on the CPU engine) unless the user sets cost constants. The
zero-step prior follows the host's ``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND``; chains
get every step count up to the startup one (:func:`controller_config`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from sglang_spec_ext.adaptive import AdaptiveConfig
from sglang_spec_ext.adaptive.config import CHAIN_DEFAULTS
from sglang_spec_ext.adaptive.prior import (
    PRESETS,
    SIZED_FIELDS,
    ModelSizes,
    StepCostParams,
    sized_prior,
)

logger = logging.getLogger("sglang_spec_ext")

SKIP_ZERO_STEP_ENV = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
#: Cost-model prior by draft kind, unless the user names one.
KIND_PRESETS = {
    "eagle": "llama3-8b-h100-eagle3",
    "eagle3": "llama3-8b-h100-eagle3",
    "mtp": "llama3-8b-h100-mtp",
    "standalone": "llama3-8b-h100-standalone-1b",
}


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


def served_roofline(runner: Any) -> StepCostParams | None:
    """The analytic step-cost prior (the H100 preset's shape) sized to the target served
    by ``runner`` with no draft model, with a CPU's device constants on the CPU engine:
    the ragged verify gate's prior before it has timed steps (``suffix/lengths.py``).
    ``None`` where the runner is not where SGLang 0.5.23 keeps it (or there is none)."""
    if runner is None:
        return None
    try:
        params, nbytes, kv = _runner_sizes(runner)
        device = str(getattr(runner, "device", "cuda"))
    except Exception as exc:  # noqa: BLE001 - a missing attribute must not stop the server
        logger.warning("sglang-spec-ext: model sizes unavailable (%s); unsized cost prior", exc)
        return None
    return sized_prior(PRESETS["llama3-8b-h100"], ModelSizes(device, params, nbytes, kv))


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


def sizes_note(sizes: ModelSizes | None) -> str:
    """What the log line of :func:`~adaptive.attach` says of the sized prior ("" unsized)."""
    return "" if sizes is None else (
        f" with the served models' sizes (target {_size(sizes.target_bytes)}, draft "
        f"{_size(sizes.draft_bytes)}{', CPU device constants' if sizes.device == 'cpu' else ''})"
    )  # fmt: skip
