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
* HYBRID's draft-confidence tap, put on the draft worker before the host captures its
  graphs (``sglang/hybrid_confidence.py``); always on, inert for other algorithms;
* fixes of host bugs that break speculative serving (``sglang/host_fixes.py``), on
  every host, switched by ``SGLANG_SPEC_EXT_HOST_FIXES`` (default on);
* plain decode steps where a speculative step has nothing to verify (zero draft steps
  of model drafts; ``sglang/plain_step.py``), switched by ``SGLANG_SPEC_EXT_PLAIN_STEPS``
  (default on; SUFFIX's own empty steps are in ``suffix_worker.py``);
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
    # before the metrics: their AFTER hook on EAGLEWorkerV2.verify must see plain steps too
    if config.plain_steps:
        from sglang_spec_ext.sglang.plain_step import install_plain_steps

        installed += install_plain_steps(config.stats_log_interval_s)
    from sglang_spec_ext.sglang.metrics import install_metrics

    installed += install_metrics()  # inert until the host enables metrics / our algorithms run
    from sglang_spec_ext.sglang.lora_support import install_lora_support

    install_lora_support()  # --enable-lora with SUFFIX / HYBRID; inert otherwise, unlisted
    from sglang_spec_ext.sglang.external_corpus import install_external_corpus

    installed += install_external_corpus()  # /add_external_corpus for SUFFIX; inert otherwise
    from sglang_spec_ext.sglang.hybrid_confidence import install_tap_hook

    installed += install_tap_hook()  # HYBRID's draft confidence under graphs; inert otherwise
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
    any was newly registered.

    The host's ``apply_hooks`` patches a target once: a hook registered for a target an
    earlier ``apply_hooks`` already patched would be recorded and never applied (our
    metrics hook ``EAGLEWorkerV2.verify`` before the plain-step hook on it, for one). Such
    a hook is wrapped around the target's current (already hooked) attribute here, with
    the host's own wrapper for its hook type."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    new, late = False, []
    for target, hook, hook_type in hooks:
        if not any(h is hook for _t, h, _s in HookRegistry._hooks.get(target, ())):
            if target in HookRegistry._patched:
                late.append((target, hook, hook_type))
            HookRegistry.register(target, hook, hook_type)
            new = True
    if new:
        HookRegistry.apply_hooks()
    for target, hook, hook_type in late:
        _wrap_patched_target(target, hook, hook_type)
    return new


def _wrap_patched_target(target: str, hook: Any, hook_type: Any) -> None:
    """Wrap ``hook`` around the current attribute of an already patched ``target``."""
    import pkgutil

    from sglang.srt.plugins import hook_registry

    obj_path, attr = target.rsplit(".", 1)
    obj = pkgutil.resolve_name(obj_path)
    current = getattr(obj, attr)
    if isinstance(obj, type) and isinstance(obj.__dict__.get(attr), classmethod | staticmethod):
        raise TypeError(f"{target}: late hooks on class or static methods are not supported")
    setattr(obj, attr, hook_registry._wrap_fn(current, hook, hook_type))
