"""Which attention backends run a ragged target verify, and how each reads the lengths.

A ragged verify (``verify/ragged.py``) puts each request's own ``L_i`` verify tokens
through the target, ``sum L_i`` rows in request order. The attention backend has to know
the ``L_i``; there are two routes, chosen per worker at start-up (:func:`ragged_route`):

* **tree route**: the verify input carries the lengths (``ragged_lens_cpu``), read with
  each request's tree mask: trees and chains alike. The CPU engine's ``torch_native``
  with the plugin's verify attention (``cpu/fallbacks/verify_attention.py``), and the
  host's triton backend, whose extend kernel is ragged: the plugin cuts the verify
  metadata the host builds to the lengths (``triton_ragged.py``; eager steps, not in the
  host's deterministic mode or with sliding-window layers); and the host's FA3 with tree
  drafts, whose cascade verify (a prefix pass, then a pass per draft token over the
  drafts it sees) is varlen too: the plugin cuts both passes' metadata
  (``fa3_ragged.py``; eager steps, not with sliding-window layers).
* **host-layout route**: the verify input carries the host's own ``RaggedVerifyLayout``
  (``spec_info.ragged_verify_layout``, ``srt/speculative/ragged_verify.py``), from which
  the backend builds its varlen geometry (``build_ragged_target_verify_geometry``:
  ``cu_seqlens_q`` from the lengths, ``cache_seqlens = seq_lens + L_i``) and attends
  causally. The host's FA3 (``FlashAttentionBackend``, its ``topk <= 1`` target verify)
  and trtllm_mha backends read it, in eager and in their token-bucket graphs. Causal
  means chains: a draft tree's siblings would see each other, so this route serves
  chain drafts only (SUFFIX with ``SGLANG_SPEC_EXT_USE_TREE=0``, which resolves
  ``--speculative-eagle-topk 1``; HYBRID's suffix rows, chains on these backends at topk
  1); trees take the tree route on FA3 and stay padded on trtllm_mha. For chain drafts
  the CPU engine takes this route too, with an attention of FA3's semantics on the
  geometry the host builds (``cpu/causal_ragged_attention.py``), so the test bed runs the
  very contract the GPU backends read.

* flashinfer: its eager target verify ignores a layout and its graphs refuse one, but the
  prefill it plans is ragged; the verify input (SUFFIX's NGRAM one, HYBRID's EAGLE one)
  hands the planner per-request queries, keys and mask cut to the lengths
  (``flashinfer_ragged.py``, the tree route; eager steps, not with sliding-window layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

#: Backends that read ``ragged_lens_cpu`` with each request's tree mask: the CPU engine's
#: (the plugin's verify attention) and the host's triton (its extend kernel is ragged; the
#: plugin cuts its verify metadata to the lengths, ``triton_ragged.py``).
TREE_ROUTE_BACKENDS = ("TorchNativeAttnBackend", "TritonAttnBackend")
#: Host backends whose causal target verify reads ``spec_info.ragged_verify_layout``.
HOST_LAYOUT_BACKENDS = ("FlashAttentionBackend", "TRTLLMHAAttnBackend")
#: The host's FA3 / FA4 backend: chains on the host layout, trees on the tree route with
#: its cascade verify metadata cut to the lengths (``fa3_ragged.py``).
FA3_BACKEND = "FlashAttentionBackend"
#: ``--attention-backend`` names of :data:`HOST_LAYOUT_BACKENDS`.
HOST_LAYOUT_BACKEND_FLAGS = ("fa3", "trtllm_mha")
#: The attribute a tree-route verify input carries during the target forward.
LENS_ATTR = "ragged_lens_cpu"
#: ... and its requests' committed lengths, host values (what flashinfer's cut reads).
SEQ_LENS_ATTR = "ragged_seq_lens_cpu"
#: The host's flashinfer backend: the tree route through the verify input's prefill
#: arguments (``flashinfer_ragged.py``: SUFFIX's NGRAM and HYBRID's EAGLE verify inputs).
FLASHINFER_BACKEND = "FlashInferAttnBackend"


@dataclass(frozen=True)
class RaggedRoute:
    """How one worker's target reads a ragged verify's lengths."""

    backend: str  # the attention backend's class name
    host_layout: bool  # the verify input carries the host's RaggedVerifyLayout

    def describe(self) -> str:
        if self.host_layout:
            return f"the host's ragged layout, read by {self.backend} (causal: chain drafts)"
        if self.backend == "TritonAttnBackend":
            return "the host's triton kernel on verify metadata cut to each request's length"
        if self.backend == FLASHINFER_BACKEND:
            return "the host's flashinfer prefill planned per request's length"
        if self.backend == FA3_BACKEND:
            return (
                "the host's FA3 tree verify (prefix and per-draft passes) on metadata cut "
                "to each request's length"
            )
        return f"the plugin's tree verify on {self.backend}"


def triton_ragged_problem(backend: Any) -> str | None:
    """Why the triton ``backend`` keeps a padded verify (None: ragged runs)."""
    if getattr(backend, "enable_deterministic", False):
        return (
            "the triton backend's deterministic mode runs one verify width per batch "
            "(its unified kernel)"
        )
    window = getattr(backend, "sliding_window_size", None)
    if window is not None and window > 0:
        return "the triton backend's sliding-window layers read a uniform verify mask"
    return None


def fa3_tree_ragged_problem(backend: Any) -> str | None:
    """Why the FA3 ``backend`` keeps a padded tree verify (None: ragged runs)."""
    if getattr(backend, "has_swa", False) or getattr(backend, "use_sliding_window_kv_pool", False):
        return "the FA3 backend's sliding-window layers verify a uniform width per request"
    if getattr(backend, "local_attn_builder", None) is not None:
        return "the FA3 backend's chunked local attention verifies a uniform width"
    return None


def flashinfer_ragged_problem(backend: Any) -> str | None:
    """Why the flashinfer ``backend`` keeps a padded verify (None: ragged runs)."""
    window = getattr(getattr(backend, "indices_updater_prefill", None), "sliding_window_size", None)
    if getattr(backend, "use_sliding_window_kv_pool", False) or (window is not None and window > 0):
        return "the flashinfer backend's sliding-window layers plan a uniform verify"
    return None


#: Host backends on the tree route whose verify metadata the plugin cuts to the lengths,
#: each with why it keeps a padded verify: triton and flashinfer (trees and chains); FA3's
#: trees (its chains read the host layout).
_CUT_PROBLEMS = {
    "TritonAttnBackend": triton_ragged_problem,
    FLASHINFER_BACKEND: flashinfer_ragged_problem,
}


#: The host's wrapper of full-attention and linear-attention (GDN, Mamba) layers.
HYBRID_LINEAR_BACKEND = "HybridLinearAttnBackend"


def ragged_route(model_runner: Any, chains: bool) -> tuple[RaggedRoute | None, str | None]:
    """The route of a target whose drafts are chains (``chains``) or trees: ``(route,
    None)``, or ``(None, why the verify stays padded)``."""
    backend = getattr(model_runner, "attn_backend", None)
    name = type(backend).__name__
    if name == HYBRID_LINEAR_BACKEND:
        return None, (
            "linear-attention layers (HybridLinearAttnBackend: GDN / Mamba state): the host's "
            "GDN target verify reshapes the verify tokens to one draft count per request and "
            "keeps per-step states at that width; verify stays padded to the batch's width"
        )
    check = fa3_tree_ragged_problem if name == FA3_BACKEND and not chains else None
    check = check or _CUT_PROBLEMS.get(name)
    if check is not None:
        problem = check(backend)
        if problem is not None:
            return None, f"{problem}; verify stays padded to the batch's width"
        return RaggedRoute(name, host_layout=False), None
    if name in TREE_ROUTE_BACKENDS:
        return RaggedRoute(name, host_layout=chains), None
    if name in HOST_LAYOUT_BACKENDS:
        if chains:
            return RaggedRoute(name, host_layout=True), None
        return None, (
            f"the {name} attention backend verifies a ragged layout causally (chain "
            "drafts only) and these drafts are trees; set SGLANG_SPEC_EXT_USE_TREE=0 to "
            "verify chains, each at its own length"
        )
    return None, (
        f"the {name} attention backend has no ragged target verify (ragged: "
        f"{', '.join((*TREE_ROUTE_BACKENDS, FLASHINFER_BACKEND, *HOST_LAYOUT_BACKENDS))}); "
        "verify stays padded to the batch's width"
    )


def to_device(host: torch.Tensor, device: Any) -> torch.Tensor:
    """``host`` (a CPU tensor of host values) on ``device`` in one non-blocking copy, from
    pinned memory on a GPU (a pageable copy waits for the stream); itself on a CPU."""
    if torch.device(device).type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def layout_from_lens(lens: list[int], device: Any, graph_num_tokens: int | None = None) -> Any:
    """The host's ``RaggedVerifyLayout`` of per-request ``lens`` (root included), built
    from host values: the lengths, ``qo_indptr`` and start offsets go to the device in one
    non-blocking copy (pinned on a GPU), no device work and no host sync (the host's
    ``from_verify_lens`` copies from pageable memory, which waits for the stream).
    ``graph_num_tokens``: the token bucket it replays in (default: its own total)."""
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    bs, total = len(lens), int(sum(lens))
    host = torch.empty(3 * bs + 1, dtype=torch.int32)
    host[:bs] = torch.as_tensor(lens, dtype=torch.int32)
    host[bs] = 0
    torch.cumsum(host[:bs], dim=0, out=host[bs + 1 : 2 * bs + 1])
    host[2 * bs + 1 :] = host[bs : 2 * bs]
    dev = to_device(host, device)
    return RaggedVerifyLayout(
        verify_lens=dev[:bs],
        graph_num_tokens=total if graph_num_tokens is None else int(graph_num_tokens),
        extend_start_loc=dev[2 * bs + 1 :],
        qo_indptr_device=dev[bs : 2 * bs + 1],
        verify_lens_cpu=[int(n) for n in lens],
        total_verify_tokens=total,
    )


def carry_lens(
    spec_info: Any, lens: list[int], route: RaggedRoute, device: Any, seq_lens_cpu: Any = None
) -> None:
    """Put a ragged verify's lengths where ``route``'s backend reads them (no host sync:
    ``lens`` are host values, :func:`layout_from_lens`; ``seq_lens_cpu``: the requests'
    committed lengths on the host, which flashinfer's cut reads). A layout the verify input
    already carries (a token bucket's, ``ragged_graphs.py``) is kept."""
    if not route.host_layout:
        setattr(spec_info, LENS_ATTR, list(lens))
        setattr(spec_info, SEQ_LENS_ATTR, seq_lens_cpu)
        return
    if getattr(spec_info, "ragged_verify_layout", None) is None:
        spec_info.ragged_verify_layout = layout_from_lens(lens, device)


def drop_lens(spec_info: Any) -> None:
    """Undo :func:`carry_lens` (and a bucket's layout) after the forward."""
    setattr(spec_info, LENS_ATTR, None)
    setattr(spec_info, SEQ_LENS_ATTR, None)
    if getattr(spec_info, "ragged_verify_layout", None) is not None:
        spec_info.ragged_verify_layout = None
