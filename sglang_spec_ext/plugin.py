"""Plugin entry point and composition root: ``[project.entry-points."sglang.srt.plugins"]``.

SGLang's ``load_plugins()`` calls :func:`register` in every host process
(launcher, scheduler, detokenizer, DP controller) and swallows exceptions, so
this function must be idempotent, cheap, and log loudly when it cannot work.
Host modules are imported inside the functions, never at import time.

This is the one place that wires the installers together: each installer
(``sglang/serving``, ``sglang/workers``, ``sglang/model_drafts``, ``sglang/verify``,
``sglang/host/fixes.py``, ``sglang/cpu``) registers its own hooks through the hook
mechanism (``sglang/host/hooks.py``), which imports none of them. What is installed:

* the request guard (``sglang/serving/request_guard.py``): options our algorithms would
  serve wrong are refused with a 400 naming the option; always on, inert unless the
  server runs one of our algorithms;
* our metrics (``sglang/serving/metrics.py``): ``sglang:spec_ext_*`` series on
  ``/metrics`` with ``--enable-metrics`` and the per-request ``meta_info["spec_ext"]``;
* LoRA with our algorithms (``sglang/serving/lora_support.py``): the host's LoRA check
  lets SUFFIX pass like NGRAM and HYBRID by its EAGLE rules; always on, inert otherwise;
* the host's external-corpus endpoints for SUFFIX (``sglang/serving/external_corpus.py``);
  always on, inert for other algorithms;
* HYBRID's draft-confidence tap, put on the draft worker before the host captures its
  graphs (``sglang/workers/hybrid_confidence.py``); always on, inert otherwise;
* fixes of host bugs that break speculative serving (``sglang/host/fixes.py``,
  ``sglang/verify/memory_check.py``), switched by ``SGLANG_SPEC_EXT_HOST_FIXES``
  (default on);
* plain decode steps where a speculative step has nothing to verify (zero draft steps
  of model drafts; ``sglang/workers/plain_step.py``), switched by
  ``SGLANG_SPEC_EXT_PLAIN_STEPS`` (default on; SUFFIX's own empty steps are in its worker);
* with ``SGLANG_SPEC_EXT_ADAPTIVE=1``, the goodput controller for model drafts
  (``sglang/model_drafts/adaptive.py``) and the KV reserve for its widths
  (``sglang/verify/kv_reserve.py``); with ``SGLANG_SPEC_EXT_DRAFT_KV_REPAIR=1`` the
  draft-KV repair for STANDALONE drafts at zero steps (``sglang/model_drafts/kv_repair.py``);
* on the host's CPU engine only (``sglang/cpu``, never imported on a GPU host): the
  pure-torch kernel fallbacks, ``torch_native`` draft attention and the stand-ins for
  the CUDA of the host's prefill-decode disaggregation (``sglang/cpu/disaggregation.py``),
  switched by
  ``SGLANG_SPEC_EXT_CPU_FALLBACKS`` (default on), and the CUDA-graph and overlap
  emulations (``SGLANG_SPEC_EXT_CPU_GRAPHS=1``, ``SGLANG_SPEC_EXT_CPU_OVERLAP=1``).
"""

from __future__ import annotations

import logging

from sglang_spec_ext import ALGORITHMS
from sglang_spec_ext.config import PluginConfig, load_config

logger = logging.getLogger("sglang_spec_ext")

__all__ = ["ALGORITHMS", "install_runtime_hooks", "register"]


def register() -> list[str]:
    """Register our algorithms and runtime hooks with SGLang. Returns the names
    registered by this package (already-registered names included)."""
    from sglang_spec_ext.sglang.host.version import check_host

    try:
        version = check_host()
    except Exception as e:
        logger.error("sglang-spec-ext is not registering: %s", e)
        raise

    from sglang_spec_ext.sglang.serving.registration import register_algorithms

    register_algorithms({"SUFFIX": _worker_factory, "HYBRID": _hybrid_worker_factory})
    install_runtime_hooks()
    if _host_runs_cpu_engine():
        from sglang_spec_ext.sglang.cpu.overlap import install_cpu_overlap

        install_cpu_overlap()  # only with SGLANG_SPEC_EXT_CPU_OVERLAP=1
    logger.debug("sglang-spec-ext registered %s with sglang %s", ALGORITHMS, version)
    return list(ALGORITHMS)


def install_runtime_hooks() -> list[str]:
    """Install the runtime hooks the configuration asks for; return what was installed."""
    config = load_config()
    installed: list[str] = []
    from sglang_spec_ext.sglang.serving.request_guard import install_request_guard

    if install_request_guard():
        installed.append("request_guard")
    # before the metrics: their AFTER hook on EAGLEWorkerV2.verify must see plain steps too
    if config.plain_steps:
        from sglang_spec_ext.sglang.workers.plain_step import install_plain_steps

        installed += install_plain_steps(config.stats_log_interval_s)
    from sglang_spec_ext.sglang.serving.metrics import install_metrics

    installed += install_metrics()  # inert until the host enables metrics / our algorithms run
    from sglang_spec_ext.sglang.serving.lora_support import install_lora_support

    install_lora_support()  # --enable-lora with SUFFIX / HYBRID; inert otherwise, unlisted
    from sglang_spec_ext.sglang.serving.external_corpus import install_external_corpus

    installed += install_external_corpus()  # /add_external_corpus for SUFFIX; inert otherwise
    from sglang_spec_ext.sglang.workers.hybrid_confidence import install_tap_hook

    installed += install_tap_hook()  # HYBRID's draft confidence under graphs; inert otherwise
    if config.host_fixes:
        from sglang_spec_ext.sglang.host.fixes import install_host_fixes
        from sglang_spec_ext.sglang.verify.memory_check import install_verify_memory_check

        installed += install_host_fixes()
        installed += install_verify_memory_check()
    else:
        logger.warning(
            "sglang-spec-ext host fixes disabled (SGLANG_SPEC_EXT_HOST_FIXES=0): speculative "
            "requests near the context limit can leak KV slots (see docs/operations.md)"
        )
    if config.adaptive:
        from sglang_spec_ext.sglang.model_drafts.adaptive import install_model_draft_adaptive
        from sglang_spec_ext.sglang.verify.kv_reserve import install_adaptive_kv_reserve

        installed += install_model_draft_adaptive()
        installed += install_adaptive_kv_reserve()
    if config.draft_kv_repair:
        from sglang_spec_ext.sglang.model_drafts.kv_repair import install_draft_kv_repair

        installed += install_draft_kv_repair(
            config.draft_kv_repair_max_tokens, config.stats_log_interval_s
        )
    if _host_runs_cpu_engine():
        installed += _install_cpu_engine(config)
    elif config.ragged_verify:
        # Ragged verify metadata for the triton backend, FA3's tree verify and flashinfer
        # (inert unless a verify carries per-request lengths: verify/triton_ragged.py,
        # verify/fa3_ragged.py, verify/flashinfer_ragged.py).
        from sglang_spec_ext.sglang.verify.fa3_ragged import install_fa3_ragged
        from sglang_spec_ext.sglang.verify.flashinfer_ragged import install_flashinfer_ragged
        from sglang_spec_ext.sglang.verify.triton_ragged import install_triton_ragged

        installed += install_triton_ragged()
        installed += install_fa3_ragged()
        installed += install_flashinfer_ragged()
        if config.ragged_graphs:
            # Token-bucket verify graphs for chain drafts on FA3 / trtllm_mha (inert unless
            # SUFFIX's spec class opts in: verify/ragged_graphs.py).
            from sglang_spec_ext.sglang.verify.ragged_graphs import install_ragged_graphs

            installed += install_ragged_graphs()
    return installed


def _host_runs_cpu_engine() -> bool:
    from sglang_spec_ext.sglang.host.platform import host_runs_cpu_engine

    return host_runs_cpu_engine()


def _install_cpu_engine(config: PluginConfig) -> list[str]:
    """The CPU engine's pieces (``sglang/cpu``): kernel fallbacks and ``torch_native``
    draft attention where configured, and the CUDA-graph emulation where switched on."""
    installed: list[str] = []
    if config.cpu_fallbacks:
        from sglang_spec_ext.sglang.cpu.disaggregation import install_cpu_disaggregation
        from sglang_spec_ext.sglang.cpu.dp_attention import install_dp_attention_cpu
        from sglang_spec_ext.sglang.cpu.draft_attention import install_draft_attention
        from sglang_spec_ext.sglang.cpu.fallbacks.install import install_cpu_fallbacks
        from sglang_spec_ext.sglang.cpu.mla import install_mla_cpu
        from sglang_spec_ext.sglang.cpu.mtp_heads import install_mtp_heads_cpu

        installed += install_cpu_fallbacks()
        installed += install_draft_attention()
        installed += install_mla_cpu()
        installed += install_mtp_heads_cpu()
        installed += install_dp_attention_cpu()
        installed += install_cpu_disaggregation()  # CUDA stand-ins of the host's PD code
    else:
        logger.debug("CPU kernel fallbacks disabled by configuration")
    from sglang_spec_ext.sglang.cpu.graphs import install_cpu_graphs

    graphs = install_cpu_graphs()  # only with SGLANG_SPEC_EXT_CPU_GRAPHS=1
    installed += graphs
    if graphs and config.ragged_verify and config.ragged_graphs:
        # Token-bucket verify graphs: on the CPU engine only the graph emulation has a
        # ragged verify in graphs (verify/ragged_graphs.py).
        from sglang_spec_ext.sglang.verify.ragged_graphs import install_ragged_graphs

        installed += install_ragged_graphs()
    return installed


def _worker_factory(server_args: object) -> type:
    from sglang_spec_ext.sglang.workers.factories import suffix_worker_class

    return suffix_worker_class()


def _hybrid_worker_factory(server_args: object) -> type:
    from sglang_spec_ext.sglang.workers.factories import hybrid_worker_class

    return hybrid_worker_class()
