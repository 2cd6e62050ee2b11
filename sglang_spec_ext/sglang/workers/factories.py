"""Which worker class the host builds for each of our algorithms (the spec's factory)."""

from __future__ import annotations

from typing import Any


def suffix_worker_class() -> type:
    """SUFFIX: the adaptive worker with ``SGLANG_SPEC_EXT_ADAPTIVE=1``, else the fixed-width one."""
    from sglang_spec_ext.sglang.serving.server_args import plugin_config

    if plugin_config().adaptive:
        from sglang_spec_ext.sglang.workers.adaptive_worker import AdaptiveSuffixWorker

        return AdaptiveSuffixWorker
    from sglang_spec_ext.sglang.workers.suffix_worker import SuffixWorker

    return SuffixWorker


def hybrid_worker_class(kind: str | None = None) -> type:
    """The HYBRID worker class for a draft kind (``model_drafts/draft_kind.py``; default:
    the kind the launcher resolved, :func:`~..serving.server_args.hybrid_kind`)."""
    if kind is None:
        from sglang_spec_ext.sglang.serving.server_args import hybrid_kind

        kind = hybrid_kind()
    if kind == "standalone":
        from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

        base: type = StandaloneWorkerV2
    else:
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        base = EAGLEWorkerV2

    from sglang_spec_ext.sglang.workers.hybrid_worker import HybridMixin

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)
        self._init_hybrid()

    name = {"standalone": "HybridStandaloneWorker", "eagle": "HybridEagleWorker",
            "eagle3": "HybridEagle3Worker"}[kind]  # fmt: skip
    return type(
        name,
        (HybridMixin, base),
        {"__init__": __init__, "__module__": "sglang_spec_ext.sglang.workers.hybrid_worker"},
    )
