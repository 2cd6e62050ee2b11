"""Graph-safe decode attention for the CPU engine's ``torch_native`` backend.

The host's ``TorchNativeAttnBackend.forward_decode`` loops over the requests in Python
and slices each request's KV rows by its length (``req_to_token[idx, :seq_len]``). Under
a captured graph (``SGLANG_SPEC_EXT_CPU_GRAPHS=1``, sglang/cpu/graphs.py) that loop and
those lengths are burned in at capture: a replay would attend over the capture-time
lengths, which is wrong. A CUDA-graph-capable backend instead reads lengths from device
buffers with fixed-shape tensor ops; this module installs the same on CPU (the kernels
are ``masked_attention.py``'s):

* the K/V rows of every request are gathered through ``req_to_token`` over a fixed
  width (the pool's maximum context length), so the shapes depend only on the batch
  size, never on the lengths;
* positions at or beyond each request's ``seq_lens`` entry are masked out, so padded
  requests (``seq_lens`` = the fill value, pool index 0) cost work but change nothing.

It is installed with the graph emulation and used for decode both eagerly and in
graphs, so the eager fallback (``can_run_graph`` false) and a replay compute the same
thing. Sliding-window layers (Gemma 3, a mask over the full KV pool) get the window as
a mask on positions, as the host's loop slices it. Cross-attention, encoder lengths and an
SWA KV pool keep the host's loop (not graph-safe; the emulation's capture refuses none of
them, so keep such models eager).

Target verify (speculative decoding) works the same way, the way a GPU backend
(triton, flashinfer) handles it: outside the captured region
(``init_forward_metadata_out_graph``, run before capture and before every replay) the
step's tree mask is copied from the verify input into a static ``[max_bs, n, n]`` buffer;
inside, :func:`masked_verify_attention` reads that buffer, the request lengths and the
draft slots from static buffers only. Forwards not being captured (the eager path and
the warm-ups) keep the plugin's CPU fallback (``cpu_fallbacks/verify_attention.py``).
A verify that carries the host's ragged layout (token-bucket graphs,
``verify/ragged_graphs.py``) takes the ragged kernel of ``ragged_attention.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sglang_spec_ext.sglang.cpu.graph_capture import is_capturing
from sglang_spec_ext.sglang.cpu.masked_attention import (
    masked_decode_attention,
    masked_extend_attention,
    masked_verify_attention,
    stage_verify_mask,
)
from sglang_spec_ext.sglang.cpu.ragged_attention import (
    masked_ragged_verify_attention,
    stage_ragged,
)

#: Padded requests get this length (>= 1, so a masked row never attends to nothing).
SEQ_LEN_FILL_VALUE = 1

BACKEND_CLS = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"


def init_forward_metadata_out_graph_hook(
    original: Callable[..., Any], self: Any, forward_batch: Any, *a: Any, **kw: Any
) -> Any:
    """AROUND ``init_forward_metadata_out_graph`` (the graph runners' out-of-graph prep,
    at capture and before every replay): stage the verify tree mask into the static
    buffer."""
    result = original(self, forward_batch, *a, **kw)
    if not forward_batch.forward_mode.is_target_verify():
        return result
    max_bs = getattr(self, "_graph_max_bs", None)
    spec_info = forward_batch.spec_info
    if max_bs is None or spec_info is None:
        return result
    n = int(spec_info.draft_token_num)
    in_capture = bool(kw.get("in_capture", a[0] if a else False))
    if getattr(spec_info, "ragged_verify_layout", None) is not None:
        stage_ragged(self, spec_info, n, max_bs, in_capture)
        return result
    masks = self.__dict__.setdefault("_graph_verify_masks", {})
    if n not in masks:
        masks[n] = torch.ones(max_bs, n, n, dtype=torch.bool).tril()
    # At capture the verify input is the runner's placeholder (values are not used).
    stage_verify_mask(masks[n], None if in_capture else getattr(spec_info, "custom_mask", None))
    return result


def forward_hook(
    original: Callable[..., torch.Tensor],
    self: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer: Any,
    forward_batch: Any,
    save_kv_cache: bool = True,
    **kwargs: Any,
) -> torch.Tensor:
    """AROUND ``TorchNativeAttnBackend.forward``: a verify forward being captured into a
    graph takes the graph-safe verify (recorded, so every replay runs it); a model draft's
    draft extend (``DRAFT_EXTEND_V2``) takes the graph-safe masked extend, eagerly and in
    graphs alike (its capture batch has no prefix lengths for the host's loop); everything
    else (eager verify, the warm-ups before capture) goes where the host sends it."""
    mode = forward_batch.forward_mode
    if (
        kwargs
        or not (mode.is_draft_extend_v2() or (mode.is_target_verify() and is_capturing()))
        or not _graph_safe(layer, forward_batch)
        or self.use_sliding_window_kv_pool
    ):
        return original(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if save_kv_cache and k is not None and v is not None:
        self.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v
        )
    heads = layer.tp_q_head_num
    bs = forward_batch.req_pool_indices.shape[0]
    query = q.reshape(-1, heads, layer.qk_head_dim)
    kv = (  # the KV pool and each request's rows and committed length
        self.token_to_kv_pool.get_key_buffer(layer.layer_id),
        self.token_to_kv_pool.get_value_buffer(layer.layer_id),
        self.req_to_token_pool.req_to_token,
        forward_batch.req_pool_indices,
        forward_batch.seq_lens[:bs],
    )
    gqa = heads != layer.tp_k_head_num
    window = _window(layer)
    layout = getattr(forward_batch.spec_info, "ragged_verify_layout", None)
    if mode.is_draft_extend_v2():
        out = masked_extend_attention(query, *kv, layer.scaling, gqa, window)
    elif layout is not None:
        out = masked_ragged_verify_attention(
            query, *kv, forward_batch.out_cache_loc, layout.verify_lens,
            layout.qo_indptr_device, self._graph_ragged_mask[:bs], layer.scaling, gqa,
            window, forward_batch.positions,
        )  # fmt: skip
    else:
        n = int(forward_batch.spec_info.draft_token_num)
        slots = forward_batch.out_cache_loc[: bs * n].view(bs, n)
        mask = self._graph_verify_masks[n][:bs]
        positions = forward_batch.positions[: bs * n]
        out = masked_verify_attention(
            query, *kv, slots, mask, layer.scaling, gqa, window, positions
        )
    return out.reshape(-1, heads * layer.v_head_dim)


def _graph_safe(layer: Any, forward_batch: Any) -> bool:
    return (
        not getattr(layer, "is_cross_attention", False)
        and getattr(forward_batch, "encoder_lens", None) is None
    )


def _window(layer: Any) -> int:
    """The layer's sliding window (the host's ``sliding_window_size``), -1 for none."""
    window = getattr(layer, "sliding_window_size", None)
    return -1 if window is None or window <= -1 else int(window)


def forward_decode_hook(
    original: Callable[..., torch.Tensor],
    self: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer: Any,
    forward_batch: Any,
    save_kv_cache: bool = True,
    **kwargs: Any,
) -> torch.Tensor:
    """AROUND ``TorchNativeAttnBackend.forward_decode``: masked dense decode attention
    where it is graph-safe, the host's per-request loop otherwise."""
    if kwargs or not _graph_safe(layer, forward_batch) or self.use_sliding_window_kv_pool:
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
    if save_kv_cache and k is not None and v is not None:
        self.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v
        )
    out = masked_decode_attention(
        q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
        self.token_to_kv_pool.get_key_buffer(layer.layer_id),
        self.token_to_kv_pool.get_value_buffer(layer.layer_id),
        self.req_to_token_pool.req_to_token,
        forward_batch.req_pool_indices,
        forward_batch.seq_lens,
        layer.scaling,
        layer.tp_q_head_num != layer.tp_k_head_num,
        _window(layer),
    )
    return out.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)


def init_cuda_graph_state(self: Any, max_bs: int, max_num_tokens: int) -> None:
    """Record the largest captured batch; the verify tree-mask buffers are made per
    verify width at the first out-of-graph prep (decode needs none)."""
    self._graph_max_bs = max_bs
    self._graph_verify_masks = {}
    self._graph_ragged_mask = None
    # Token-bucket verify graphs (verify/ragged_graphs.py) may replay on this backend:
    # masked_ragged_verify_attention (cpu/ragged_attention.py) reads their layout.
    self.supports_ragged_verify_graph = True


def get_cuda_graph_seq_len_fill_value(self: Any) -> int:
    """Length given to padded requests in a captured batch."""
    return SEQ_LEN_FILL_VALUE


def attention_hooks() -> list[tuple[str, Any, Any]]:
    """``(target, hook, HookType)`` for :func:`runtime_hooks.register_hooks_once`."""
    from sglang.srt.plugins.hook_registry import HookType

    return [
        (BACKEND_CLS + ".forward", forward_hook, HookType.AROUND),
        (
            BACKEND_CLS + ".init_forward_metadata_out_graph",
            init_forward_metadata_out_graph_hook,
            HookType.AROUND,
        ),
        (BACKEND_CLS + ".forward_decode", forward_decode_hook, HookType.AROUND),
        (BACKEND_CLS + ".init_cuda_graph_state", init_cuda_graph_state, HookType.REPLACE),
        (
            BACKEND_CLS + ".get_cuda_graph_seq_len_fill_value",
            get_cuda_graph_seq_len_fill_value,
            HookType.REPLACE,
        ),
    ]
