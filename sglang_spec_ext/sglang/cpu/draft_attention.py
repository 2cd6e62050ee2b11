"""Draft attention backends for model drafts (STANDALONE, EAGLE, EAGLE3) on ``torch_native``.

The host's model-draft workers (``eagle_worker_v2.py``, ``standalone_worker_v2.py``)
ask ``DraftBackendFactory`` (``speculative/draft_utils.py``) for two attention backends:
a *multi-step draft decode* backend (one per-step backend for each of the first
``num_steps - 1`` draft forwards) and a *draft extend* backend. In SGLang 0.5.23 the
factory knows GPU backends and ``intel_amx`` (whose attention ops come from
sgl-kernel's CPU build, not on PyPI), but not ``torch_native``, the only attention
backend the CPU engine can run without that build, so the server stops at start-up:
``EAGLE is not supported in decode attention backend torch_native``.

We chose pure-torch draft backends for ``torch_native`` over pure-torch versions of
the ``intel_amx`` ops (``decode_attention_cpu``, ``extend_attention_cpu``,
``build_draft_decode_metadata_cpu``): the draft then runs on the same backend, and
the same SDPA code, as the target, we need no ``torch.ops.sgl_kernel`` registrations
(which would make every "does the host have this kernel" probe lie), and the only new
logic is the per-branch KV table below. The draft extend is a plain
``TorchNativeAttnBackend`` (a draft extend is an ordinary causal extend).

Semantics of the multi-step draft decode (as the host's GPU and ``intel_amx``
backends): with page size 1 the draft worker writes branch ``t``'s step-``s`` token of
request ``b`` at ``req_to_token[b, seq_len + t * num_steps + s]``
(``assign_draft_cache_locs_contiguous``); at draft step ``i`` the query of branch
``t`` attends to the request's ``seq_len`` committed tokens and to its own branch's
first ``i + 1`` draft slots (:func:`draft_decode_table`).

Installed by :func:`install_draft_attention` (from the plugin's runtime hooks) only
on the CPU engine, as AROUND hooks on the two factory methods that take over only
when the resolved backend is ``torch_native``; ``intel_amx`` with sgl-kernel's real
CPU ops goes to the host, and any other backend (which cannot run on the CPU engine)
is refused at start-up with an error naming the flag (:class:`DraftAttentionUnsupported`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger("sglang_spec_ext")

BACKEND = "torch_native"
_FACTORY = "sglang.srt.speculative.draft_utils.DraftBackendFactory"
DECODE_TARGET = f"{_FACTORY}.create_decode_backend"
EXTEND_TARGET = f"{_FACTORY}.create_draft_extend_backend"
#: Name reported by :func:`install_draft_attention`.
INSTALLED_NAME = "torch_native_draft_attention"


def draft_decode_table(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    width: int | None = None,
) -> torch.Tensor:
    """The KV slots each draft branch reads, one row per (request, branch).

    Row ``b * topk + t`` holds request ``b``'s ``seq_lens[b]`` committed slots followed
    by branch ``t``'s ``num_steps`` draft slots
    (``req_to_token[r, seq_len + t * num_steps : seq_len + (t + 1) * num_steps]``);
    entries past ``seq_lens[b] + num_steps`` are 0. Shape ``[bs * topk, width]``, dtype
    of ``req_to_token``; ``width`` defaults to ``max(seq_lens) + num_steps`` (a host read);
    a fixed ``width`` (the pool's row length) keeps the shape independent of the
    lengths, as a captured graph needs.
    """
    bs = seq_lens.numel()
    seq = seq_lens.reshape(-1).to(torch.int64)
    if width is None:
        width = (int(seq.max()) if bs else 0) + num_steps
    device = req_to_token.device
    col = torch.arange(width, device=device, dtype=torch.int64)[None, None, :]  # [1, 1, W]
    branch = torch.arange(topk, device=device, dtype=torch.int64)[None, :, None]  # [1, K, 1]
    prefix = seq[:, None, None]  # [B, 1, 1]
    source = torch.where(col < prefix, col, col + branch * num_steps)  # [B, K, W]
    valid = col < prefix + num_steps
    source = torch.where(valid, source, torch.zeros_like(source))
    source = source.clamp(max=req_to_token.shape[1] - 1)
    rows = req_to_token[req_pool_indices.reshape(-1).to(torch.int64)]  # [B, pool_len]
    table = torch.gather(rows[:, None, :].expand(bs, topk, rows.shape[1]), 2, source)
    table = torch.where(valid, table, torch.zeros_like(table))
    return table.reshape(bs * topk, width)


def _host_backend_class() -> type:
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    return TorchNativeAttnBackend


def _make_step_backend(model_runner: Any, masked: bool = False) -> Any:
    """One per-step draft decode backend: ``torch_native`` reading a per-branch KV table."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    base = _host_backend_class()

    class TorchNativeDraftStepBackend(base):  # type: ignore[misc, valid-type]
        """``TorchNativeAttnBackend`` whose decode reads :func:`draft_decode_table` rows."""

        def __init__(self, runner: Any, masked: bool = False) -> None:
            super().__init__(runner)
            # (table [bs*topk, W], seq_lens [bs*topk], row indices [bs*topk]), set per draft
            self.draft_decode_metadata: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
            self.draft_decode_metadata = None
            #: Dense masked attention over a fixed-width table (graph-safe) instead of
            #: the host's per-request loop (CPU graph emulation).
            self.masked = masked

        def forward_decode(
            self,
            q: torch.Tensor,
            k: torch.Tensor,
            v: torch.Tensor,
            layer: Any,
            forward_batch: Any,
            save_kv_cache: bool = True,
            **kwargs: Any,
        ) -> torch.Tensor:
            if self.draft_decode_metadata is None or layer.is_cross_attention:
                return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
            table, seq_lens, rows = self.draft_decode_metadata
            q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
            if save_kv_cache and k is not None and v is not None:
                self.token_to_kv_pool.set_kv_buffer(
                    layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v
                )
            window = layer.sliding_window_size
            if self.masked and (window is None or window <= -1):
                from sglang_spec_ext.sglang.cpu.masked_attention import masked_table_attention

                out = masked_table_attention(
                    q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
                    self.token_to_kv_pool.get_key_buffer(layer.layer_id),
                    self.token_to_kv_pool.get_value_buffer(layer.layer_id),
                    table,
                    seq_lens,
                    layer.scaling,
                    layer.tp_q_head_num != layer.tp_k_head_num,
                )
                return out.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)
            o = q.new_empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim))
            self._run_sdpa_forward_decode(
                q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
                o.view(-1, layer.tp_q_head_num, layer.v_head_dim),
                self.token_to_kv_pool.get_key_buffer(layer.layer_id),
                self.token_to_kv_pool.get_value_buffer(layer.layer_id),
                table,
                rows,
                seq_lens,
                None,
                scaling=layer.scaling,
                enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
                causal=False,
                is_cross_attn=False,
                sliding_window_size=window if window is not None and window > -1 else None,
            )
            return o

    return TorchNativeDraftStepBackend(model_runner, masked)


class TorchNativeMultiStepDraftBackend:
    """The multi-step draft decode container for ``torch_native`` (the host's
    ``*MultiStepDraftBackend`` shape: ``attn_backends[i]`` serves draft step ``i``).

    ``graph_safe`` (on under ``SGLANG_SPEC_EXT_CPU_GRAPHS=1``): the per-branch table has
    the pool's row length and the step backends attend densely with a length mask, so
    the host's draft graph runner (``EAGLEDraftCudaGraphRunner``) can capture the whole
    draft; eager drafts then compute the same thing. It also carries the graph-runner
    interface that runner calls (``init_cuda_graph_state``, the out-of-graph and
    in-graph metadata)."""

    def __init__(
        self,
        model_runner: Any,
        topk: int,
        speculative_num_steps: int,
        graph_safe: bool = False,
    ) -> None:
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.device = model_runner.device
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.graph_safe = graph_safe
        self.attn_backends: list[Any] = [
            _make_step_backend(model_runner, graph_safe) for _ in range(speculative_num_steps - 1)
        ]

    def init_forward_metadata(self, forward_batch: Any) -> None:
        seq_lens = forward_batch.seq_lens.reshape(-1).to(torch.int64)
        table = draft_decode_table(
            self.req_to_token,
            forward_batch.req_pool_indices,
            seq_lens,
            self.topk,
            self.speculative_num_steps,
            width=self.req_to_token.shape[1] if self.graph_safe else None,
        )
        rows = torch.arange(table.shape[0], dtype=torch.int64, device=table.device)
        expanded = seq_lens.repeat_interleave(self.topk)
        for step, backend in enumerate(self.attn_backends):
            backend.init_forward_metadata(forward_batch)
            backend.draft_decode_metadata = (table, expanded + step + 1, rows)

    # The graph runner's interface (only the graph-safe form is ever captured).
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        for backend in self.attn_backends:
            backend.init_cuda_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
        """Nothing to prepare outside the graph: lengths and pool indices are read from
        the runner's static buffers inside it."""

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        """Recorded into the draft graph: the fixed-width table from the static buffers."""
        if not self.graph_safe:
            raise RuntimeError("torch_native draft decode captured without its graph-safe form")
        self.init_forward_metadata(forward_batch)


def _resolved_backend(factory: Any, phase: str) -> str | None:
    """The attention backend the factory would build for ``phase`` ("decode"/"extend")."""
    from sglang.srt.runtime_context import attention_backends, get_spec

    prefill, decode = attention_backends()
    if phase == "decode" or get_spec().speculative_attention_mode == "decode":
        configured = decode
    else:
        configured = prefill
    return factory.draft_attn_backend or configured


class DraftAttentionUnsupported(ValueError):
    """A draft attention backend that cannot run on this CPU engine (names the flag)."""


def _backend_flag(factory: Any, phase: str) -> str:
    if factory.draft_attn_backend:
        return "--speculative-draft-attention-backend"
    if phase == "decode":
        return "--decode-attention-backend / --attention-backend"
    return "--prefill-attention-backend / --attention-backend"


def _refuse_on_cpu(factory: Any, phase: str, backend: str | None) -> None:
    """On the CPU engine, only ``torch_native`` (ours) and ``intel_amx`` with sgl-kernel's
    CPU build can serve a draft: refuse anything else at start-up, naming the flag."""
    if backend == BACKEND:
        return
    from sglang_spec_ext.sglang.cpu.fallbacks.install import _torch_op_is_callable_on_cpu

    if backend == "intel_amx" and _torch_op_is_callable_on_cpu("decode_attention_cpu"):
        return  # the host's own CPU backend, with its real kernels
    why = (
        "needs sgl-kernel's CPU build, which is not installed"
        if backend == "intel_amx"
        else "is not a CPU attention backend"
    )
    raise DraftAttentionUnsupported(
        f"{_backend_flag(factory, phase)} {backend}: the speculative draft's attention "
        f"backend {backend!r} {why}; on the CPU engine use {BACKEND} "
        f"(--attention-backend {BACKEND}, and leave --speculative-draft-attention-backend "
        f"unset or set it to {BACKEND})"
    )


def _stamp(backend: Any, children: bool = False) -> None:
    backend.prefill_attention_backend_str = BACKEND
    backend.decode_attention_backend_str = BACKEND
    for child in getattr(backend, "attn_backends", ()) if children else ():
        _stamp(child)


def create_decode_backend_hook(original: Callable[..., Any], factory: Any) -> Any:
    """AROUND ``DraftBackendFactory.create_decode_backend``: ``torch_native`` drafts here."""
    if factory.speculative_num_steps <= 1 or getattr(factory, "qsa_profile", None) is not None:
        return original(factory)
    resolved = _resolved_backend(factory, "decode")
    _refuse_on_cpu(factory, "decode", resolved)
    if resolved != BACKEND:
        return original(factory)
    from sglang.srt.layers.attention.attention_registry import (
        attn_backend_wrapper_for_draft_decode,
    )

    from sglang_spec_ext.sglang.cpu.graph_capture import cpu_graphs_requested

    backend = TorchNativeMultiStepDraftBackend(
        factory.draft_model_runner,
        factory.topk,
        factory.speculative_num_steps,
        graph_safe=cpu_graphs_requested(),
    )
    wrapped = attn_backend_wrapper_for_draft_decode(factory.draft_model_runner, backend)
    _stamp(wrapped, children=True)
    return wrapped


def create_draft_extend_backend_hook(original: Callable[..., Any], factory: Any) -> Any:
    """AROUND ``DraftBackendFactory.create_draft_extend_backend``: a ``torch_native``
    draft extend is the host's own ``TorchNativeAttnBackend``."""
    if getattr(factory, "qsa_profile", None) is not None:
        return original(factory)
    resolved = _resolved_backend(factory, "extend")
    _refuse_on_cpu(factory, "extend", resolved)
    if resolved != BACKEND:
        return original(factory)
    from sglang.srt.layers.attention.attention_registry import (
        attn_backend_wrapper_for_draft_extend,
    )

    backend = _host_backend_class()(factory.draft_model_runner)
    _stamp(backend)
    wrapped = attn_backend_wrapper_for_draft_extend(factory.draft_model_runner, backend)
    if wrapped is not None and wrapped is not backend:
        _stamp(wrapped)
    return wrapped


def install_draft_attention() -> list[str]:
    """Give the host's draft backend factory ``torch_native`` backends, on the CPU engine
    only; return ``[INSTALLED_NAME]`` if installed (now or before), else ``[]``.

    Skipped off the CPU engine, and where the host's factory already builds a
    ``torch_native`` draft backend (a later host version). Idempotent.
    """
    from sglang_spec_ext.sglang.host.hooks import register_hooks_once
    from sglang_spec_ext.sglang.host.platform import host_runs_cpu_engine

    if not host_runs_cpu_engine():
        return []
    try:
        from sglang.srt.plugins.hook_registry import HookType
        from sglang.srt.speculative import draft_utils
    except ImportError as e:  # pragma: no cover - host layout changed
        logger.warning("sglang-spec-ext: cannot add torch_native draft attention: %s", e)
        return []
    factory = draft_utils.DraftBackendFactory
    if hasattr(factory, "_create_torch_native_decode_backend"):
        logger.info("host builds torch_native draft backends itself; not patched")
        return []
    hooks = [
        (DECODE_TARGET, create_decode_backend_hook, HookType.AROUND),
        (EXTEND_TARGET, create_draft_extend_backend_hook, HookType.AROUND),
    ]
    if register_hooks_once(hooks):
        logger.info("sglang-spec-ext: torch_native draft attention backends installed")
    return [INSTALLED_NAME]
