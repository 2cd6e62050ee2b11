"""The target's verify attention backend at every adaptive SUFFIX width.

Adaptive SUFFIX (``SGLANG_SPEC_EXT_ADAPTIVE=1``, ``adaptive_worker.py``) verifies
``W`` tokens per request, ``W`` chosen per decode step in ``1 ..
--speculative-num-draft-tokens``. The host's verify input (``NgramVerifyInput``)
carries ``W``; whether the target's attention metadata follows it depends on the
backend:

* flashinfer and triton take the width from the batch's ``spec_info``
  (``num_tokens_per_req`` / ``draft_token_num``), at any page size: one backend
  serves every width;
* FA3 / FA4 (``FlashAttentionBackend``) size their eager target-verify metadata
  (``cu_seqlens_q``, KV lengths, and with tree drafts the extraction of each draft
  row from the custom mask) by ``speculative_num_draft_tokens`` read once at
  construction: at any other width the query rows and the mask are misread. Other
  host backends that keep the width from start-up behave alike.

So, like the host's own adaptive EAGLE (``adaptive_runtime_state.py``: one runtime
state per step count, swapped before the step), :class:`VerifyWidthBackends` keeps
one target attention backend per width for a backend of the second kind, built with
the host's own factory (``ModelRunner._get_attention_backend``) while the
resolved ``speculative_num_draft_tokens`` is that width, and swaps
``model_runner.attn_backend`` before each step.

CUDA graphs: the host's decode graph runner refuses a verify whose
``num_tokens_per_req`` differs from its capture width, so with graphs on every width
but the startup one would run eagerly. Where the startup width has a graph runner,
:meth:`VerifyWidthBackends.prepare_graphs` builds, for each width the controller can
choose, a graph runner of the same class captured at that width
(``attn_backend=`` / ``speculative_num_draft_tokens=``, as the host's adaptive EAGLE
builds its per-state target runners) on an attention backend of its own (graph state
buffers belong to a backend, so even flashinfer and triton get one per width), and
:meth:`activate` swaps ``model_runner.decode_cuda_graph_runner`` with the backend.
Everything is built at start-up (``AdaptiveSuffixWorker.init_cuda_graphs``), so a
backend or runner that cannot be built per width stops the server there, with the
flag to change.

tests/host/test_verify_attention_metadata.py checks the metadata of the real FA3,
triton and flashinfer code at every width, page size 1 and 16.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

logger = logging.getLogger("sglang_spec_ext")

#: Backends whose target-verify metadata reads the width from the batch's spec_info
#: (exact classes: a subclass may build its metadata differently). torch_native
#: verifies through our own hook (cpu_fallbacks/verify_attention.py), which reads
#: ``spec_info.draft_token_num``.
SPEC_INFO_WIDTH_BACKENDS = frozenset(
    {
        "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend",
        "sglang.srt.layers.attention.triton_backend.TritonAttnBackend",
        "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend",
    }
)

_SOURCE = "sglang_spec_ext.adaptive_verify_width"


class VerifyWidthBackendError(RuntimeError):
    """The target attention backend cannot be built for a verify width."""


def backend_name(backend: Any) -> str:
    cls = type(backend)
    return f"{cls.__module__}.{cls.__qualname__}"


def reads_width_from_spec_info(backend: Any) -> bool:
    """Whether ``backend`` sizes its target-verify metadata from the batch's spec_info."""
    return backend_name(backend) in SPEC_INFO_WIDTH_BACKENDS


@contextlib.contextmanager
def resolved_verify_width(width: int) -> Iterator[None]:
    """The resolved ``speculative_num_draft_tokens`` is ``width`` inside the block."""
    from sglang.srt.runtime_context import get_context, get_spec

    context = get_context()
    startup = get_spec().speculative_num_draft_tokens
    context.override(_SOURCE, speculative_num_draft_tokens=width)
    try:
        yield
    finally:
        context.override(_SOURCE + ".restore", speculative_num_draft_tokens=startup)


class VerifyWidthBackends:
    """One target attention backend per verify width, swapped into the model runner."""

    def __init__(self, model_runner: Any, startup_width: int, label: str = "SUFFIX") -> None:
        self.model_runner = model_runner
        self.label = label  # the algorithm the log lines name
        self.startup_width = startup_width
        self.startup_backend = model_runner.attn_backend
        #: True when the startup backend serves every width.
        self.shared = reads_width_from_spec_info(self.startup_backend)
        self._backends: dict[int, Any] = {startup_width: self.startup_backend}
        #: The startup width's graph runner (``None`` without graphs) and, per other
        #: width with graphs, (its own attention backend, its graph runner).
        self.startup_graphs: Any = getattr(model_runner, "decode_cuda_graph_runner", None)
        self._graphs: dict[int, tuple[Any, Any]] = {}

    def prepare(self, widths: Iterable[int]) -> None:
        """Build the backends of ``widths`` now (at start-up), not during a step."""
        widths = sorted(set(widths))
        for width in widths:
            self.backend(width)
        if not self.shared and len(widths) > 1:
            logger.info(
                "%s: %s sizes its verify metadata at start-up; built one "
                "target attention backend per verify width %s. Width %d keeps the "
                "CUDA graphs, the others run eagerly.",
                self.label,
                type(self.startup_backend).__name__,
                widths,
                self.startup_width,
            )

    def prepare_graphs(self, widths: Iterable[int]) -> None:
        """A graph runner per width in ``widths`` (at start-up), where the startup width
        has one; a width without one verifies eagerly."""
        if self.startup_graphs is None:
            return
        runner_cls = type(self.startup_graphs)
        built = []
        for width in sorted(set(widths) - {self.startup_width} - set(self._graphs)):
            backend = self._build(width, own_workspace=True)
            try:
                with resolved_verify_width(width):
                    graphs = runner_cls(
                        self.model_runner, attn_backend=backend, speculative_num_draft_tokens=width
                    )
            except Exception as exc:
                raise VerifyWidthBackendError(
                    f"SGLANG_SPEC_EXT_ADAPTIVE=1: could not capture the target's "
                    f"{runner_cls.__name__} at verify width {width} ({type(exc).__name__}: "
                    f"{exc}). Lower --cuda-graph-max-bs-decode or "
                    "--speculative-num-draft-tokens, or unset SGLANG_SPEC_EXT_ADAPTIVE to "
                    "verify at the fixed width."
                ) from exc
            self._graphs[width] = (backend, graphs)
            built.append(width)
        if built:
            logger.info(
                "SUFFIX: target verify graphs captured at widths %s besides the "
                "startup width %d (%s)",
                built,
                self.startup_width,
                runner_cls.__name__,
            )

    def backend(self, width: int) -> Any:
        """The target attention backend that verifies ``width`` tokens per request (a
        width with graphs: the backend its graphs were captured with)."""
        state = self._graphs.get(width)
        if state is not None:
            return state[0]
        if self.shared:
            return self.startup_backend
        backend = self._backends.get(width)
        if backend is None:
            backend = self._backends[width] = self._build(width)
        return backend

    def graph_runner(self, width: int) -> Any:
        """The target's verify graph runner at ``width`` (None: that width has none)."""
        if width == self.startup_width:
            return self.startup_graphs
        state = self._graphs.get(width)
        return None if state is None else state[1]

    def activate(self, width: int) -> None:
        """Make the target model runner verify ``width`` tokens per request (with that
        width's graphs where it has them)."""
        self.model_runner.attn_backend = self.backend(width)
        if self.startup_graphs is not None:
            state = self._graphs.get(width)
            self.model_runner.decode_cuda_graph_runner = (
                self.startup_graphs if state is None else state[1]
            )

    def _build(self, width: int, own_workspace: bool = False) -> Any:
        runner = self.model_runner
        name = backend_name(self.startup_backend)
        saved_workspace = getattr(runner, "init_new_workspace", False)
        try:
            with resolved_verify_width(width):
                # Eager backends run one at a time on one stream, so they can share the
                # host's workspace buffer; a graph's backend gets its own (as the host's
                # adaptive EAGLE states do).
                backend = runner._get_attention_backend(init_new_workspace=own_workspace)
        except Exception as exc:
            raise VerifyWidthBackendError(
                f"SGLANG_SPEC_EXT_ADAPTIVE=1: the target attention backend {name} keeps "
                f"the verify width from start-up and could not be built for width "
                f"{width} ({type(exc).__name__}: {exc}). Use --attention-backend "
                "flashinfer or triton (they read the width per step), or unset "
                "SGLANG_SPEC_EXT_ADAPTIVE to verify at the fixed width."
            ) from exc
        finally:
            if hasattr(runner, "init_new_workspace"):
                runner.init_new_workspace = saved_workspace
        built = getattr(backend, "speculative_num_draft_tokens", width)
        if built != width:
            raise VerifyWidthBackendError(
                f"SGLANG_SPEC_EXT_ADAPTIVE=1: the target attention backend {name} built "
                f"for verify width {width} reports width {built}. Use --attention-backend "
                "flashinfer or triton, or unset SGLANG_SPEC_EXT_ADAPTIVE."
            )
        return backend
