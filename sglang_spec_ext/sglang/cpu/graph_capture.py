"""The captured-graph stand-in of the CPU graph emulation (``graphs.py`` installs it).

:class:`TracedGraph` stands in for ``torch.cuda.CUDAGraph``: ``capture(fn)`` runs ``fn``
once under ``make_fx`` in real tracing mode, recording every torch op it dispatches into
an FX program. Tensors ``fn`` closes over (static input buffers, weights, the KV pool)
stay the *same objects* in that program, so in-place writes re-run on them at every
replay. Values read back into Python during capture (``.item()``, ``.tolist()``,
``int(t)``) are burned into the program, exactly like a host read during CUDA-graph
capture. ``replay()`` re-runs the program and copies its results into the output
tensors ``fn`` returned at capture (a CUDA graph refreshes its captured outputs in
place), then returns that captured output object. :class:`CpuGraphDeviceModule` and
:class:`SyncEvent` answer the device-module calls the host's runners make around it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import torch

#: The switch (environment variable).
ENV = "SGLANG_SPEC_EXT_CPU_GRAPHS"
_TRUE = ("1", "true", "yes", "on")


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
