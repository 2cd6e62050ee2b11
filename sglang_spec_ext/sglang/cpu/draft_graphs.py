"""The model drafts' own graph runners on the CPU engine (``SGLANG_SPEC_EXT_CPU_GRAPHS=1``).

On a GPU the host's model-draft worker (``EagleDraftWorker._capture_cuda_graphs`` in
``speculative/eagle_worker_v2.py``, also STANDALONE's and HYBRID's) captures two more
graph runners next to the target's verify graphs: ``EAGLEDraftCudaGraphRunner`` (the
whole multi-step draft: every draft forward, the top-k selection and the tree
organisation, for ``--speculative-num-steps`` > 1) and ``EAGLEDraftExtendCudaGraphRunner``
(the draft extend over the verified tokens). On the CPU engine the host returns before
building either (``_is_cpu``), so every draft ran eagerly there, unlike on a GPU.

Under the switch, :func:`capture_draft_graphs_hook` builds both runners on the CPU engine
exactly where a GPU builds them (the decode graph phase on; the draft runner only for
more than one step; the extend runner only with a draft-extend backend and without
``SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH``). They capture with the traced-graph backend
of ``cpu/graphs.py`` (``resolve_decode_backend`` is already hooked) and the graph-safe
``torch_native`` draft attention: the multi-step draft backend in its fixed-width form
(``draft_attention.py``) and the masked draft extend (``cpu/graph_attention.py``). The
host's worker then replays them through its own ``can_run_graph`` checks, padding and
static-buffer copies, as on a GPU.

What a replay therefore freezes, as a real CUDA graph does: anything Python inside the
draft forward (a wrapper on ``draft_runner.forward``, a counter in a hook) ran at capture
only. HYBRID's per-step model confidence is therefore recorded as device work into a
buffer, by a tap installed before these runners capture (``hybrid_confidence.py``), so a
replay writes it as an eager draft does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from sglang_spec_ext.sglang.cpu.graph_capture import ENV, cpu_graphs_requested

logger = logging.getLogger("sglang_spec_ext")

#: Where the host's model-draft worker builds its draft and draft-extend graph runners.
CAPTURE_DRAFT_GRAPHS_TARGET = (
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._capture_cuda_graphs"
)
#: Logged per runner built (the e2e tests look for it).
DRAFT_CAPTURE_MESSAGE = "sglang-spec-ext: CPU graphs: draft graph runner captured:"


def _draft_graphs_wanted(worker: Any) -> bool:
    if not cpu_graphs_requested() or str(getattr(worker, "device", "")) != "cpu":
        return False
    from sglang.srt.model_executor.cuda_graph_config import (
        Backend,
        Phase,
        check_cuda_graph_backend,
    )

    return not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)


def _build(worker: Any, runner_cls: type, label: str) -> Any:
    tic = time.perf_counter()
    runner = runner_cls(worker)
    logger.info(
        "%s %s (%s) bs=%s in %.2f s (%s=1)",
        DRAFT_CAPTURE_MESSAGE,
        label,
        runner_cls.__name__,
        getattr(runner, "capture_bs", None),
        time.perf_counter() - tic,
        ENV,
    )
    return runner


def capture_draft_graphs_hook(original: Callable[..., Any], worker: Any, *a: Any, **kw: Any) -> Any:
    """AROUND ``EagleDraftWorker._capture_cuda_graphs``: the host's own runners on the CPU
    engine under the switch (the host skips them there); unchanged otherwise."""
    result = original(worker, *a, **kw)
    if not _draft_graphs_wanted(worker):
        return result
    from sglang.srt.environ import envs
    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import (
        EAGLEDraftCudaGraphRunner,
    )
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
        EAGLEDraftExtendCudaGraphRunner,
    )

    if worker.cuda_graph_runner is None and worker.speculative_num_steps > 1:
        worker.cuda_graph_runner = _build(worker, EAGLEDraftCudaGraphRunner, "draft decode")
    if (
        worker.cuda_graph_runner_for_draft_extend is None
        and worker.draft_extend_attn_backend is not None
        and not envs.SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH.get()
    ):
        worker.cuda_graph_runner_for_draft_extend = _build(
            worker, EAGLEDraftExtendCudaGraphRunner, "draft extend"
        )
    return result


def draft_graph_hooks() -> list[tuple[str, Any, Any]]:
    """``(target, hook, HookType)`` for :func:`runtime_hooks.register_hooks_once`."""
    from sglang.srt.plugins.hook_registry import HookType

    return [(CAPTURE_DRAFT_GRAPHS_TARGET, capture_draft_graphs_hook, HookType.AROUND)]
