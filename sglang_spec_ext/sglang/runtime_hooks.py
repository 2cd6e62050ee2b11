"""Runtime patches the plugin applies to the host in every process.

Called by :func:`sglang_spec_ext.plugin.register` (so in every process SGLang's
``load_plugins()`` runs in):

* the request guard (``sglang/request_guard.py``): options our algorithms would serve
  wrong are refused with a 400 naming the option; always on, inert unless the server
  runs one of our algorithms;
* our metrics (``sglang/metrics.py``): ``sglang:spec_ext_*`` series on ``/metrics`` with
  ``--enable-metrics`` and the per-request ``meta_info["spec_ext"]`` record;
* LoRA with our algorithms (``sglang/lora_support.py``): the host's LoRA check lets
  SUFFIX pass like NGRAM and HYBRID by its EAGLE rules; always on, inert otherwise;
* the host's external-corpus endpoints for SUFFIX (``sglang/external_corpus.py``);
  always on, inert for other algorithms;
* fixes of host bugs that break speculative serving (``sglang/host_fixes.py``), on
  every host, switched by ``SGLANG_SPEC_EXT_HOST_FIXES`` (default on);
* with ``SGLANG_SPEC_EXT_ADAPTIVE=1``, the goodput controller for model drafts
  (``sglang/model_draft_adaptive.py``): EAGLE, EAGLE3, STANDALONE and HYBRID step counts;
  with ``SGLANG_SPEC_EXT_DRAFT_KV_REPAIR=1`` also the draft-KV repair for STANDALONE
  drafts at zero steps (``sglang/draft_kv_repair.py``);
* the pure-torch CPU kernel fallbacks, switched by ``SGLANG_SPEC_EXT_CPU_FALLBACKS``
  (default on). Each decides for itself whether the host needs it; on GPU hosts
  nothing is installed.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_spec_ext.config import load_config

logger = logging.getLogger("sglang_spec_ext")


def install_runtime_hooks() -> list[str]:
    """Install the runtime hooks the configuration asks for; return what was installed."""
    config = load_config()
    installed: list[str] = []
    from sglang_spec_ext.sglang.request_guard import install_request_guard

    if install_request_guard():
        installed.append("request_guard")
    from sglang_spec_ext.sglang.metrics import install_metrics

    installed += install_metrics()  # inert until the host enables metrics / our algorithms run
    from sglang_spec_ext.sglang.lora_support import install_lora_support

    install_lora_support()  # --enable-lora with SUFFIX / HYBRID; inert otherwise, unlisted
    from sglang_spec_ext.sglang.external_corpus import install_external_corpus

    installed += install_external_corpus()  # /add_external_corpus for SUFFIX; inert otherwise
    if config.host_fixes:
        from sglang_spec_ext.sglang.host_fixes import install_host_fixes

        installed += install_host_fixes()
        from sglang_spec_ext.sglang.verify_memory import install_verify_memory_check

        installed += install_verify_memory_check()
    else:
        logger.warning(
            "sglang-spec-ext host fixes disabled (SGLANG_SPEC_EXT_HOST_FIXES=0): speculative "
            "requests near the context limit can leak KV slots (see docs/operations.md)"
        )
    if config.adaptive:
        from sglang_spec_ext.sglang.model_draft_adaptive import install_model_draft_adaptive

        installed += install_model_draft_adaptive()
        from sglang_spec_ext.sglang.adaptive_kv_reserve import install_adaptive_kv_reserve

        installed += install_adaptive_kv_reserve()
    if config.draft_kv_repair:
        from sglang_spec_ext.sglang.draft_kv_repair import install_draft_kv_repair

        installed += install_draft_kv_repair(
            config.draft_kv_repair_max_tokens, config.stats_log_interval_s
        )
    if config.cpu_fallbacks:
        from sglang_spec_ext.sglang.cpu_fallbacks.install import install_cpu_fallbacks

        installed += install_cpu_fallbacks()
        installed += _install_cpu_draft_attention()
    else:
        logger.debug("CPU kernel fallbacks disabled by configuration")
    from sglang_spec_ext.sglang.cpu_graphs import install_cpu_graphs

    installed += install_cpu_graphs()  # only with SGLANG_SPEC_EXT_CPU_GRAPHS=1 on the CPU engine
    return installed


def _install_cpu_draft_attention() -> list[str]:
    """torch_native draft attention for model drafts on the CPU engine (sglang/draft_attention.py)."""
    from sglang_spec_ext.sglang.draft_attention import install_draft_attention

    return install_draft_attention()


def register_hooks_once(hooks: list[tuple[str, Any, Any]]) -> bool:
    """Register ``(target, hook, HookType)`` with SGLang's ``HookRegistry`` unless that
    hook is already on that target, and apply them (idempotent across calls); True if
    any was newly registered."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    new = False
    for target, hook, hook_type in hooks:
        if not any(h is hook for _t, h, _s in HookRegistry._hooks.get(target, ())):
            HookRegistry.register(target, hook, hook_type)
            new = True
    if new:
        HookRegistry.apply_hooks()
    return new
