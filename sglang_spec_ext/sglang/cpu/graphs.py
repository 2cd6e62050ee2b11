"""CUDA-graph emulation for SGLang's CPU engine (a test bed).

On a GPU the host's decode/verify, draft and draft-extend graph runners capture one
CUDA graph per batch size and replay it on static buffers. What a replay runs is the
*recorded device work*: Python inside the captured region (wrappers installed on a
module's ``forward``, hooks, counters, branches on host values) ran once, at capture,
and never runs again; tensor work re-runs on whatever the static buffers hold now,
including in-place writes into memory the graph closed over (the KV pool).

``SGLANG_SPEC_EXT_CPU_GRAPHS=1`` reproduces that on the CPU engine:

* :class:`~.graph_capture.TracedGraph` (``graph_capture.py``), a stand-in for
  ``torch.cuda.CUDAGraph``: one traced FX program per capture, replayed on the same
  closed-over tensors, with host reads during capture burned in as on a GPU.
* :class:`CpuTracedGraphBackend`, a runner backend (the host's
  ``BaseCudaGraphBackend`` interface) that the host's graph runners get from
  ``resolve_decode_backend`` on the CPU engine under the switch: two eager warm-ups, then
  one traced capture per shape key, replay by key, ``can_run`` by key.

Where the host is touched (each a named hook, installed only with the switch on and the
CPU engine running; nothing changes otherwise):

* argument resolution: :func:`keep_decode_graphs_hook` sets the decode graph phase back
  to ``full`` after the host turns it off for ``torch_native`` (unless the user turned
  decode graphs off); prefill graphs stay off;
* :func:`capture_decode_graph_hook`: the model runner builds the host's own
  ``DecodeCudaGraphRunner`` (decode, and target verify at the verify width) instead of
  its torch.compile CPU runner or nothing;
* :func:`resolve_decode_backend_hook`: that runner's backend is
  :class:`CpuTracedGraphBackend`, its device module :class:`CpuGraphDeviceModule`;
* :func:`graph_mode_hook`: the model runner replays for the modes a GPU replays
  (decode, target verify), not decode only;
* graph-safe ``torch_native`` decode, verify and draft-extend attention
  (``cpu/graph_attention.py``, sliding windows included), multi-step draft attention
  (``draft_attention.py``) and the host's CPU MoE while capturing (``graph_moe.py``);
* the model drafts' draft and draft-extend graph runners (``cpu/draft_graphs.py``),
  which the host does not build on the CPU engine.

Covered: plain decoding; the target verify of SUFFIX, NGRAM, STANDALONE, EAGLE/EAGLE3
and HYBRID (adaptive SUFFIX at each width its controller can choose); the model drafts'
multi-step draft and draft extend. Other algorithms keep all graphs off under the
switch, as without it.

What the emulation checks: capture per batch size, padding to the captured size and the
copies into static buffers done by the host runners, ``can_run_graph`` decisions, that
results are read from graph outputs or static buffers and not from Python state set
inside the captured region, that Python side effects and value-dependent branches inside
the region are frozen at capture, and that in-place writes to closed-over tensors repeat
at each replay. What only a GPU can check: that every op is capturable (on CPU there is
no distinction between host and device tensors, so work on what would be a host tensor is
recorded here, and a device sync inside the region does not fail capture), memory-pool
sharing and address stability between graphs, stream/event ordering, capture-time
allocator behaviour, kernel timings, and intermediates the region stashes on Python
objects (on a GPU they live at fixed addresses that every replay rewrites; here only
the returned outputs are refreshed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sglang_spec_ext.sglang.cpu.graph_capture import (
    ENV,
    CpuGraphDeviceModule,
    TracedGraph,
    cpu_graphs_requested,
)

logger = logging.getLogger("sglang_spec_ext")

#: Where the host's graph runners get their capture/replay backend.
RESOLVE_DECODE_BACKEND_TARGET = (
    "sglang.srt.model_executor.runner_backend.utils.resolve_decode_backend"
)
#: The host's resolution that turns graphs off for the ``torch_native`` attention backend.
ATTENTION_COMPAT_TARGET = (
    "sglang.srt.arg_groups.attention_hook.handle_attention_backend_compatibility"
)
#: The CPU engine's forward-mode check for graph replay (DECODE only on the host).
CPU_GRAPH_MODE_TARGET = "sglang.srt.model_executor.forward_batch_info.ForwardMode.is_cpu_graph"
#: Where the model runner builds its decode / target-verify graph runner.
CAPTURE_DECODE_GRAPH_TARGET = (
    "sglang.srt.model_executor.model_runner_components.cuda_graph_setup.capture_decode_graph"
)


#: Speculative algorithms whose graphs are emulated (the target verify through the decode
#: graph runner at the verify width; for the model drafts also their draft and
#: draft-extend runners, cpu/draft_graphs.py), tested end to end.
GRAPH_SPEC_ALGORITHMS = frozenset({"SUFFIX", "NGRAM", "STANDALONE", "EAGLE", "EAGLE3", "HYBRID"})
#: Logged when a speculative server keeps its graphs off under the switch.
SPEC_EAGER_MESSAGE = (
    "sglang-spec-ext: CPU graphs cover plain decoding and the target verify of "
    f"{', '.join(sorted(GRAPH_SPEC_ALGORITHMS))} so far; this algorithm runs eager on the "
    "CPU engine"
)
#: Logged once per captured shape, at its first replay (the e2e tests look for it).
REPLAY_MESSAGE = "sglang-spec-ext: CPU graph first replay:"
#: Logged once per captured shape (the e2e tests look for it).
CAPTURE_MESSAGE = "sglang-spec-ext: CPU graph captured:"


def _base_backend_cls() -> type:
    from sglang.srt.model_executor.runner_backend.base_cuda_graph_backend import (
        BaseCudaGraphBackend,
    )

    return BaseCudaGraphBackend


class _BackendMixin:
    """Capture/replay of one :class:`TracedGraph` per shape key, with the host's
    ``BaseCudaGraphBackend`` method names and warm-up protocol."""

    #: Eager runs before each capture, as the host's full-graph backend does.
    WARMUPS = 2

    def __init__(self, cuda_graph_runner: Any = None, **_ignored: Any) -> None:
        self._cuda_graph_runner = cuda_graph_runner
        self._graphs: dict[Any, TracedGraph] = {}

    @contextmanager
    def capture_session(self, stream: Any = None) -> Iterator[None]:
        yield

    def capture_one(
        self,
        shape_key: Any,
        forward_fn: Callable[[], Any],
        capture_inputs: Any | None = None,
        post_warmup_hook: Callable[[], None] | None = None,
    ) -> None:
        for _ in range(self.WARMUPS):
            forward_fn()
            if post_warmup_hook is not None:
                post_warmup_hook()
        graph = TracedGraph(name=str(shape_key))
        graph.capture(forward_fn)
        self._graphs[shape_key] = graph
        logger.info(
            "%s %s (%d ops) runner=%s", CAPTURE_MESSAGE, shape_key, graph.num_ops(), self._runner
        )

    def can_run(self, forward_batch: Any, shape_key: Any) -> bool:
        return shape_key in self._graphs

    @contextmanager
    def replay_session(self) -> Iterator[None]:
        yield

    def replay(self, shape_key: Any, static_forward_batch: Any = None, **kwargs: Any) -> Any:
        graph = self._graphs[shape_key]
        out = graph.replay()
        if graph.replay_count == 1:
            logger.info(
                "%s %s (%d ops) runner=%s", REPLAY_MESSAGE, shape_key, graph.num_ops(), self._runner
            )
        return out

    @property
    def _runner(self) -> str:
        return type(self._cuda_graph_runner).__name__

    def cleanup(self) -> None:
        for graph in self._graphs.values():
            graph.reset()
        self._graphs.clear()

    @property
    def graphs(self) -> dict[Any, TracedGraph]:
        """Captured graphs by shape key."""
        return self._graphs


_backend_cls: type | None = None


def cpu_traced_graph_backend_cls() -> type:
    """The backend class (``_BackendMixin`` over the host's ``BaseCudaGraphBackend``),
    built on first use so this module imports without SGLang."""
    global _backend_cls
    if _backend_cls is None:
        _backend_cls = type("CpuTracedGraphBackend", (_BackendMixin, _base_backend_cls()), {})
    return _backend_cls


def make_cpu_traced_graph_backend(cuda_graph_runner: Any = None) -> Any:
    """A new :class:`CpuTracedGraphBackend` for ``cuda_graph_runner``."""
    return cpu_traced_graph_backend_cls()(cuda_graph_runner)


def _runner_device(cuda_graph_runner: Any) -> str | None:
    model_runner = getattr(cuda_graph_runner, "model_runner", None)
    return getattr(model_runner, "device", None)


def resolve_decode_backend_hook(
    original: Callable[..., Any], cuda_graph_runner: Any, *a: Any, **kw: Any
) -> Any:
    """AROUND the host's ``resolve_decode_backend``: on the CPU engine with the switch
    on, the traced-graph backend; otherwise the host's choice."""
    if cpu_graphs_requested() and _runner_device(cuda_graph_runner) == "cpu":
        # The runner asks its device module about capture state and events.
        cuda_graph_runner.device_module = CpuGraphDeviceModule()
        return make_cpu_traced_graph_backend(cuda_graph_runner)
    return original(cuda_graph_runner, *a, **kw)


#: The host's resolution of ``NEXTN`` / ``EAGLE`` (``NEXTN`` is an alias of ``EAGLE``; both
#: become ``FROZEN_KV_MTP`` for Gemma-4 assistant drafts).
ALIAS_RESOLVER = "sglang.srt.arg_groups.speculative_hook._resolve_speculative_algorithm_alias"


def resolved_algorithm_name(cfg: Any) -> str:
    """``cfg.speculative_algorithm`` as the host will resolve it, upper case ("" for none).

    The host resolves the ``NEXTN`` alias in its speculative hook, after the
    attention-backend hook :func:`keep_decode_graphs_hook` runs in: there MTP servers
    (``--speculative-algorithm NEXTN``) still read ``NEXTN``. The host's own resolver
    (:data:`ALIAS_RESOLVER`) names what they will run (``EAGLE``, or ``FROZEN_KV_MTP``
    for a Gemma-4 assistant draft, which reads the draft's config)."""
    algorithm = str(cfg.speculative_algorithm or "").upper()
    if algorithm not in ("NEXTN", "EAGLE"):
        return algorithm
    import pkgutil

    resolve = pkgutil.resolve_name(ALIAS_RESOLVER)
    resolved = resolve(
        algorithm,
        cfg.speculative_draft_model_path,
        trust_remote_code=bool(cfg.trust_remote_code),
    )
    return str(resolved or algorithm).upper()


def keep_decode_graphs_hook(
    original: Callable[..., Any], server_args: Any, *a: Any, **kw: Any
) -> Any:
    """AROUND the host's ``handle_attention_backend_compatibility``, which turns decode and
    prefill graphs off for ``torch_native``. With the switch on the CPU engine, the decode
    phase is set back to the full-graph backend (as a GPU resolves it) unless the user
    turned decode graphs off (``--disable-cuda-graph``, ``--disable-decode-cuda-graph``,
    ``--cuda-graph-backend-decode disabled``); the prefill phase stays off."""
    result = original(server_args, *a, **kw)
    if not cpu_graphs_requested():
        return result
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    cfg = resolving_view(server_args)
    if str(cfg.device or "").split(":", 1)[0] != "cpu" or cfg.attention_backend != "torch_native":
        return result
    algorithm = resolved_algorithm_name(cfg)
    if algorithm and algorithm not in GRAPH_SPEC_ALGORITHMS:
        # The model-draft paths' draft / draft-extend graphs are not emulated yet: such
        # servers stay eager, exactly as without the switch.
        logger.warning("%s (%s)", SPEC_EAGER_MESSAGE, algorithm)
        return result
    if (
        cfg.disable_cuda_graph
        or cfg.disable_decode_cuda_graph
        or cfg.cuda_graph_backend_decode == Backend.DISABLED
        or cfg.enable_torch_compile
    ):
        return result
    declare_resolution(
        server_args,
        "sglang_spec_ext_cpu_graphs",
        cuda_graph_config=with_phase(cfg.cuda_graph_config, Phase.DECODE, backend=Backend.FULL),
    )
    logger.info("sglang-spec-ext: decode graphs kept on for the CPU engine (%s=1)", ENV)
    return result


def graph_mode_hook(original: Callable[..., bool], mode: Any) -> bool:
    """AROUND ``ForwardMode.is_cpu_graph``: with the switch on, the modes a GPU replays
    graphs for (``is_cuda_graph``: decode, target verify, idle), as the model runner
    asks on a GPU; the host's answer (decode only) otherwise."""
    if cpu_graphs_requested():
        return bool(mode.is_cuda_graph())
    return bool(original(mode))


def _decode_memory_phase(model_runner: Any) -> str:
    if model_runner.is_draft_worker:
        return "draft_decode"
    if model_runner.spec_algorithm.is_speculative():
        return "target_verify"
    return "decode"


def capture_decode_graph_hook(original: Callable[..., Any], *a: Any, **kw: Any) -> Any:
    """AROUND the host's ``capture_decode_graph``. On the CPU engine the host builds its
    torch.compile ``CPUGraphRunner`` or nothing; with the switch on (and neither
    ``--disable-cuda-graph`` nor ``--enable-torch-compile``) it builds the runner a GPU
    gets (``DecodeCudaGraphRunner``, or the model runner's own subclass), whose backend
    is then the traced-graph backend (:func:`resolve_decode_backend_hook`)."""
    model_runner = kw.get("model_runner", a[0] if a else None)
    if not (cpu_graphs_requested() and getattr(model_runner, "device", None) == "cpu"):
        return original(*a, **kw)
    if model_runner.is_draft_worker:
        return original(*a, **kw)  # the draft's runners: cpu/draft_graphs.py
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.runtime_context import get_exec, get_flags

    graph_config = get_exec().graph.cuda_graph_config
    if (
        graph_config is None
        or graph_config.decode.backend == Backend.DISABLED
        or get_flags().capture.enable_torch_compile
        or not model_runner.is_generation
    ):
        return original(*a, **kw)
    import time

    from sglang.srt.model_executor.model_runner_components.cuda_graph_setup import (
        GraphCapture,
    )

    tic = time.perf_counter()
    runner_cls = model_runner._decode_cuda_graph_runner_cls()
    runner = runner_cls(model_runner)
    elapsed = time.perf_counter() - tic
    logger.info(
        "sglang-spec-ext: CPU graphs (%s=1): %s captured bs=%s in %.2f s",
        ENV,
        runner_cls.__name__,
        getattr(runner, "capture_bs", None),
        elapsed,
    )
    return GraphCapture(
        runner=runner,
        memory_phase=_decode_memory_phase(model_runner),
        memory_usage_gb=0.0,
        capture_time=elapsed,
    )


def cpu_graphs_enabled() -> bool:
    """The switch is on and the host runs its CPU engine (nothing else is touched)."""
    if not cpu_graphs_requested():
        return False
    from sglang_spec_ext.sglang.host.platform import host_runs_cpu_engine

    return host_runs_cpu_engine()


def install_cpu_graphs() -> list[str]:
    """Install the CPU-graph pieces where the switch is on; return what was installed."""
    if not cpu_graphs_enabled():
        return []
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.cpu.draft_graphs import draft_graph_hooks
    from sglang_spec_ext.sglang.cpu.graph_attention import attention_hooks
    from sglang_spec_ext.sglang.cpu.graph_moe import moe_hooks
    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once(
        [
            (ATTENTION_COMPAT_TARGET, keep_decode_graphs_hook, HookType.AROUND),
            (CPU_GRAPH_MODE_TARGET, graph_mode_hook, HookType.AROUND),
            (RESOLVE_DECODE_BACKEND_TARGET, resolve_decode_backend_hook, HookType.AROUND),
            (CAPTURE_DECODE_GRAPH_TARGET, capture_decode_graph_hook, HookType.AROUND),
            *attention_hooks(),
            *moe_hooks(),
            *draft_graph_hooks(),
        ]
    )
    return [
        "cpu_graphs_args",
        "cpu_graphs_backend",
        "cpu_graphs_decode_runner",
        "cpu_graphs_attention",
        "cpu_graphs_moe",
        "cpu_graphs_draft_runners",
    ]
