"""CUDA-graph emulation for SGLang's CPU engine (a test bed).

On a GPU the host's decode/verify, draft and draft-extend graph runners capture one
CUDA graph per batch size and replay it on static buffers. What a replay runs is the
*recorded device work*: Python inside the captured region (wrappers installed on a
module's ``forward``, hooks, counters, branches on host values) ran once, at capture,
and never runs again; tensor work re-runs on whatever the static buffers hold now,
including in-place writes into memory the graph closed over (the KV pool).

``SGLANG_SPEC_EXT_CPU_GRAPHS=1`` reproduces that on the CPU engine:

* :class:`TracedGraph`, a stand-in for ``torch.cuda.CUDAGraph``. ``capture(fn)`` runs
  ``fn`` once under ``make_fx`` in real tracing mode, which records every torch op it
  dispatches into an FX program. Tensors ``fn`` closes over (static input buffers,
  weights, the KV pool) stay the *same objects* in that program, so in-place writes
  re-run on them at every replay. Values read back into Python during capture
  (``.item()``, ``.tolist()``, ``int(t)``) are burned into the program, exactly like a
  host read during CUDA-graph capture. ``replay()`` re-runs the program and copies its
  results into the output tensors ``fn`` returned at capture (a CUDA graph refreshes its
  captured outputs in place), then returns that captured output object.
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
  (``cpu_graph_attention.py``) and multi-step draft attention (``draft_attention.py``);
* the model drafts' draft and draft-extend graph runners (``cpu_draft_graphs.py``),
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

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

logger = logging.getLogger("sglang_spec_ext")

#: The switch (environment variable).
ENV = "SGLANG_SPEC_EXT_CPU_GRAPHS"
_TRUE = ("1", "true", "yes", "on")

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
#: draft-extend runners, cpu_draft_graphs.py), tested end to end.
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


def cpu_graphs_requested(env: dict[str, str] | None = None) -> bool:
    """Whether ``SGLANG_SPEC_EXT_CPU_GRAPHS`` asks for graph emulation on the CPU engine."""
    value = (os.environ if env is None else env).get(ENV, "")
    return value.strip().lower() in _TRUE


# ---------------------------------------------------------------------------
# The captured-graph stand-in
# ---------------------------------------------------------------------------


def _tensor_leaves(obj: Any, out: list[torch.Tensor], seen: set[int]) -> None:
    """Collect the tensors of a (nested) output in a fixed order, each object once:
    tensors, lists, tuples, dicts (values) and dataclass instances (fields)."""
    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen:
            seen.add(id(obj))
            out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _tensor_leaves(item, out, seen)
    elif isinstance(obj, dict):
        for item in obj.values():
            _tensor_leaves(item, out, seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            _tensor_leaves(getattr(obj, field.name), out, seen)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


#: Set while a :class:`TracedGraph` records (what ``is_current_stream_capturing`` reports).
_capturing = False


def is_capturing() -> bool:
    """Whether a :class:`TracedGraph` capture is in progress in this process."""
    return _capturing


class GraphCaptureError(RuntimeError):
    """The callable could not be recorded (or a graph was used in the wrong state)."""


class TracedGraph:
    """A CPU stand-in for a captured ``torch.cuda.CUDAGraph``.

    ``capture(fn)`` runs ``fn()`` exactly once, recording its torch ops, and returns what
    ``fn`` returned (the *static outputs*). ``replay()`` re-runs the recorded ops, not
    ``fn``, writes their results into the static outputs and returns them.
    """

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.replay_count = 0
        self._program: torch.fx.GraphModule | None = None
        self._static_output: Any = None
        self._static_leaves: list[torch.Tensor] = []

    @property
    def captured(self) -> bool:
        """Whether a program has been recorded (and not reset)."""
        return self._program is not None

    @property
    def program(self) -> torch.fx.GraphModule:
        """The recorded torch-op program (an FX ``GraphModule``)."""
        if self._program is None:
            raise GraphCaptureError(f"graph {self.name!r} has not been captured")
        return self._program

    @property
    def output(self) -> Any:
        """The static output object returned at capture, refreshed by each replay."""
        return self._static_output

    def num_ops(self) -> int:
        """Number of recorded op calls (FX ``call_function`` nodes)."""
        return sum(1 for n in self.program.graph.nodes if n.op == "call_function")

    def capture(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` once, record its torch ops, and return its output (static)."""
        if self._program is not None:
            raise GraphCaptureError(f"graph {self.name!r} is already captured; reset() it first")
        from torch.fx.experimental.proxy_tensor import make_fx

        holder: list[Any] = []

        def flat() -> list[torch.Tensor]:
            out = fn()
            leaves: list[torch.Tensor] = []
            _tensor_leaves(out, leaves, set())
            holder.append((out, leaves))
            return leaves

        # Real tracing mode: fn runs on real tensors; closed-over tensors are kept by
        # reference in the program (get_attr constants), so in-place ops on them repeat.
        # Host reads of traced values are allowed and burned in, as in CUDA-graph capture.
        global _capturing
        if _capturing:
            raise GraphCaptureError("nested graph capture")
        _capturing = True
        try:
            # A torch.compile'd function inside the region (the host compiles some draft
            # helpers) is recorded through its Python body, as its kernels would be on a GPU.
            with torch._dynamo.config.patch(error_on_nested_fx_trace=False):
                program = make_fx(flat, tracing_mode="real", _error_on_data_dependent_ops=False)()
        finally:
            _capturing = False
        for node in program.graph.nodes:
            # Real-mode tracing stores example values; drop them so the program does
            # not keep capture-time intermediates alive.
            node.meta.pop("val", None)
            node.meta.pop("tensor_meta", None)
        self._static_output, self._static_leaves = holder[0]
        self._program = program
        return self._static_output

    def replay(self) -> Any:
        """Re-run the recorded ops and refresh the static outputs in place."""
        new_leaves = self.program()
        for static, new in zip(self._static_leaves, new_leaves, strict=True):
            if new is static or _same_memory(new, static):
                continue
            static.copy_(new)
        self.replay_count += 1
        return self._static_output

    def reset(self) -> None:
        """Drop the recorded program and outputs (``CUDAGraph.reset``)."""
        self._program = None
        self._static_output = None
        self._static_leaves = []
        self.replay_count = 0


class SyncEvent:
    """Stand-in for a device event on the CPU engine: CPU ops finish before they return,
    so an event is complete as soon as it is recorded and waiting is a no-op."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.recorded = False

    def record(self, stream: Any = None) -> None:
        self.recorded = True

    def wait(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class CpuGraphDeviceModule:
    """The device module a graph runner sees on the CPU engine under the switch:
    ``torch.cpu`` plus what the runners ask a graph-capable device for
    (``is_current_stream_capturing`` answers whether a :class:`TracedGraph` records)."""

    Event = SyncEvent

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_current_stream_capturing() -> bool:
        return is_capturing()

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None


# ---------------------------------------------------------------------------
# The host runner backend
# ---------------------------------------------------------------------------


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
        return original(*a, **kw)  # the draft's runners: cpu_draft_graphs.py
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
    from sglang_spec_ext.sglang.cpu_fallbacks.install import host_runs_cpu_engine

    return host_runs_cpu_engine()


def install_cpu_graphs() -> list[str]:
    """Install the CPU-graph pieces where the switch is on; return what was installed."""
    if not cpu_graphs_enabled():
        return []
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.cpu_draft_graphs import draft_graph_hooks
    from sglang_spec_ext.sglang.cpu_graph_attention import attention_hooks
    from sglang_spec_ext.sglang.runtime_hooks import register_hooks_once

    register_hooks_once(
        [
            (ATTENTION_COMPAT_TARGET, keep_decode_graphs_hook, HookType.AROUND),
            (CPU_GRAPH_MODE_TARGET, graph_mode_hook, HookType.AROUND),
            (RESOLVE_DECODE_BACKEND_TARGET, resolve_decode_backend_hook, HookType.AROUND),
            (CAPTURE_DECODE_GRAPH_TARGET, capture_decode_graph_hook, HookType.AROUND),
            *attention_hooks(),
            *draft_graph_hooks(),
        ]
    )
    return [
        "cpu_graphs_args",
        "cpu_graphs_backend",
        "cpu_graphs_decode_runner",
        "cpu_graphs_attention",
        "cpu_graphs_draft_runners",
    ]
