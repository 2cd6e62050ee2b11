"""Plugin entry point: ``[project.entry-points."sglang.srt.plugins"]``.

SGLang's ``load_plugins()`` calls :func:`register` in every host process
(launcher, scheduler, detokenizer, DP controller) and swallows exceptions, so
this function must be idempotent, cheap, and log loudly when it cannot work.
Host modules are imported inside the function, never at import time.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_spec_ext")

#: Algorithm names this package registers.
ALGORITHMS: tuple[str, ...] = ("SUFFIX", "HYBRID")


def register() -> list[str]:
    """Register our algorithms and runtime hooks with SGLang. Returns the names
    registered by this package (already-registered names included)."""
    from sglang_spec_ext.sglang.host import check_host

    try:
        version = check_host()
    except Exception as e:
        logger.error("sglang-spec-ext is not registering: %s", e)
        raise

    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from sglang_spec_ext.sglang.server_args import validate_server_args
    from sglang_spec_ext.sglang.spec_class import HybridSpecAlgo, ModelFreeSpecAlgo

    specs = {
        "SUFFIX": (ModelFreeSpecAlgo, _worker_factory),
        "HYBRID": (HybridSpecAlgo, _hybrid_worker_factory),
    }
    for name in ALGORITHMS:
        if get_spec(name) is not None:
            continue
        spec_class, factory = specs[name]
        SpeculativeAlgorithm.register(
            name,
            supports_overlap=True,
            validate_server_args=validate_server_args,
            spec_class=spec_class,
        )(factory)

    from sglang_spec_ext.sglang.runtime_hooks import install_runtime_hooks

    install_runtime_hooks()
    from sglang_spec_ext.sglang.cpu_overlap import install_cpu_overlap

    install_cpu_overlap()  # only with SGLANG_SPEC_EXT_CPU_OVERLAP=1 on the CPU engine
    logger.debug("sglang-spec-ext registered %s with sglang %s", ALGORITHMS, version)
    return list(ALGORITHMS)


def _worker_factory(server_args: object) -> type:
    from sglang_spec_ext.sglang.server_args import plugin_config

    if plugin_config().adaptive:
        from sglang_spec_ext.sglang.adaptive_worker import AdaptiveSuffixWorker

        return AdaptiveSuffixWorker
    from sglang_spec_ext.sglang.suffix_worker import SuffixWorker

    return SuffixWorker


def _hybrid_worker_factory(server_args: object) -> type:
    from sglang_spec_ext.sglang.hybrid_draft import hybrid_worker_class
    from sglang_spec_ext.sglang.server_args import hybrid_kind

    return hybrid_worker_class(hybrid_kind())
