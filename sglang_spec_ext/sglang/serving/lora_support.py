"""The host's LoRA serving (``--enable-lora``, ``--lora-paths``, ``/load_lora_adapter``)
with our speculative algorithms.

sglang 0.5.23 checks LoRA + speculative decoding in
``srt/arg_groups/lora_hook.py`` (``check_lora_speculative_compatibility``, called by
``check_lora_server_args`` from ``ServerArgs.check_server_args`` in the launcher) and
allows only NGRAM, EAGLE, NEXTN, EAGLE3, DFLASH and DSPARK: any other name, ours
included, is refused at start-up. The host's rule for LoRA with speculation is that
"adapters apply to the target only; a shared draft runs unadapted", and what it needs is
a uniform per-request verify width (the LoRA segment layout,
``lora/utils.py:generate_sequence_lengths``, gives each request of a verify batch
``spec_info.draft_token_num`` tokens). Both of ours meet it:

* **SUFFIX** runs on the host's NGRAM worker (``suffix_worker.py``): model-free, the
  same verify input, fixed width per batch (padded). It passes like NGRAM.
* **HYBRID** runs on the host's EAGLE/STANDALONE V2 worker (``hybrid_worker.py``): the
  target verifies with its adapters, the draft model runs unadapted (the host builds no
  LoRA manager for a draft worker), the suffix drafts ride the same verify. It is
  checked by the host's own EAGLE rules (the host's function, run with the algorithm
  seen as EAGLE), so whatever the host refuses for LoRA with EAGLE
  (``--speculative-adaptive``, the ``experimental_sgl_trtllm`` MoE runner,
  ``SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1``) is refused for HYBRID too, with the
  host's reason and the flag named.

Refused in addition (:func:`plugin_lora_problems`): our own step/width controller
(``SGLANG_SPEC_EXT_ADAPTIVE=1``) with LoRA, for our algorithms and for the host's model
drafts it drives. It switches draft steps and verify widths at run time through
per-width runtime states and graph runners, the mechanism the host refuses with LoRA
(``--speculative-adaptive``: the runtime-state swap does not rebuild the LoRA
CUDA-graph metadata); that is not verified here, so it is refused with a message naming
both settings rather than served unchecked.

:func:`install_lora_support` registers :func:`lora_compatibility_hook` (AROUND) through
the host's ``HookRegistry`` in every process the plugin loads in (the launcher
included, where server args are checked). Other algorithms keep the host's behaviour.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("sglang_spec_ext")

TARGET = "sglang.srt.arg_groups.lora_hook.check_lora_speculative_compatibility"
SUFFIX = "SUFFIX"
HYBRID = "HYBRID"
#: What each of our algorithms is checked as by the host's LoRA rules.
CHECKED_AS: dict[str, str] = {SUFFIX: "NGRAM", HYBRID: "EAGLE"}
#: The host's algorithms our controller (SGLANG_SPEC_EXT_ADAPTIVE=1) drives
#: (model_drafts/adaptive.py), after the host's NEXTN -> EAGLE resolution.
ADAPTIVE_MODEL_DRAFTS = ("EAGLE", "EAGLE3", "STANDALONE")
ADAPTIVE_ENV = "SGLANG_SPEC_EXT_ADAPTIVE"


class _SeenAs:
    """A stand-in for ``ServerArgs`` that the host's ``resolving_view`` reads like the
    real record (current resolution included) except for the algorithm's name."""

    _resolved_overrides = ()  # the view below already applies the declarations

    def __init__(self, server_args: Any, algorithm: str) -> None:
        from sglang.srt.arg_groups.overrides import resolving_view

        self._view = resolving_view(server_args)
        self._algorithm = algorithm

    def __getattr__(self, name: str) -> Any:
        if name == "speculative_algorithm":
            return self._algorithm
        return getattr(self._view, name)


def _adaptive_requested() -> bool:
    from sglang_spec_ext.sglang.serving.server_args import plugin_config

    return plugin_config().adaptive


def plugin_lora_problems(algorithm: str | None) -> list[str]:
    """What this package refuses with LoRA for ``algorithm`` (the resolved name)."""
    if algorithm not in (*CHECKED_AS, *ADAPTIVE_MODEL_DRAFTS) or not _adaptive_requested():
        return []
    return [
        f"{ADAPTIVE_ENV}=1: sglang-spec-ext's adaptive steps/widths switch runtime states "
        "and graph runners at run time, which the host does not support with LoRA (as "
        "--speculative-adaptive); unset it, or serve without --enable-lora/--lora-paths"
    ]


def lora_compatibility_hook(original: Callable[..., Any], server_args: Any, *a: Any, **kw: Any):
    """AROUND the host's ``check_lora_speculative_compatibility``: SUFFIX as NGRAM,
    HYBRID by the host's EAGLE rules, plus :func:`plugin_lora_problems`."""
    from sglang.srt.arg_groups.overrides import resolving_view

    name = resolving_view(server_args).speculative_algorithm
    algorithm = None if name is None else str(name).upper()  # resolved names are upper case
    problems = plugin_lora_problems(algorithm)
    if problems:
        raise ValueError(
            f"LoRA with --speculative-algorithm {algorithm} cannot start:\n  - "
            + "\n  - ".join(problems)
        )
    checked_as = CHECKED_AS.get(algorithm)
    if checked_as is None:
        return original(server_args, *a, **kw)
    try:
        return original(_SeenAs(server_args, checked_as), *a, **kw)
    except ValueError as e:
        raise ValueError(
            f"--speculative-algorithm {algorithm} follows the host's {checked_as} rules "
            f"for LoRA (it runs on the host's {checked_as} path): {e}"
        ) from None


def install_lora_support() -> list[str]:
    """Register :func:`lora_compatibility_hook` (idempotent); returns ``["lora_support"]``,
    or ``[]`` where the host has no such check to hook (logged)."""
    import pkgutil

    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    owner, attr = TARGET.rsplit(".", 1)
    try:
        if not callable(getattr(pkgutil.resolve_name(owner), attr, None)):
            raise AttributeError(attr)
    except (ImportError, AttributeError) as e:
        logger.warning("sglang-spec-ext: cannot hook the host's LoRA check %s: %s", TARGET, e)
        return []
    register_hooks_once([(TARGET, lora_compatibility_hook, HookType.AROUND)])
    return ["lora_support"]
