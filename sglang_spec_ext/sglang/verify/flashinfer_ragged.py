"""Ragged tree verify on the host's flashinfer attention backend.

The host's ``FlashInferAttnBackend`` plans a target verify as a batch prefill over the
paged KV cache: per request its verify tokens are the queries (``qo_indptr``), its
committed tokens plus its verify tokens the keys (``kv_indptr`` / ``kv_indices``, read
through ``req_to_token``), and the tree mask in the FULL_MASK layout (per request ``n``
rows of ``seq_len + n`` columns) says which key each query sees. flashinfer's prefill is
ragged; only the arguments the verify input hands the planner are uniform: SGLang's
``generate_attn_arg_prefill`` of ``NgramVerifyInput`` (SUFFIX's verify input) and of
``EagleVerifyInput`` (HYBRID's, widened on its wide steps) gives every request ``W``
queries over ``seq_len + W`` keys. SGLang 0.5.23 has no ragged verify for flashinfer (its
graphs refuse a ``RaggedVerifyLayout``, its eager verify ignores one).

:func:`verify_prefill_args_hook` (AROUND both methods) makes the eager verify ragged where
a verify input carries per-request lengths (``ragged_lens_cpu``, ``ragged_backends.py``'s
tree route): queries ``[0, L_0, L_0 + L_1, ...]``, keys ``seq_len + L_i`` per request (the
committed tokens and the first ``L_i`` draft slots, which are the KV slots the compact
forward writes), packed by the host's own translator, and the mask cut to each request's
``L_i`` rows of ``seq_len + L_i`` columns (``triton_ragged.ragged_full_mask``: the same
FULL_MASK layout). Trees and chains; eager only (the verify graphs are captured for
``bs x W`` tokens and the host's runner sends a compact batch eager: its NGRAM check for
SUFFIX, its width check for HYBRID's wide steps). Not with sliding-window layers
(``ragged_backends.flashinfer_ragged_problem``).

No host sync added: lengths and committed lengths are host values (the batch's
``seq_lens_cpu``, carried on the verify input as ``ragged_seq_lens_cpu``), the offsets go
to the device in one non-blocking copy. flashinfer's own eager ``plan`` reads its offsets
on the host as it does for every padded verify.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from sglang_spec_ext.sglang.verify.ragged_backends import LENS_ATTR, SEQ_LENS_ATTR, to_device
from sglang_spec_ext.sglang.verify.triton_ragged import ragged_full_mask

#: The host methods the hook wraps: SUFFIX's verify input's and HYBRID's (the host's EAGLE
#: verify input, which a wide step widens); the same uniform layout.
PREFILL_ARGS_TARGETS = (
    "sglang.srt.speculative.ngram_info.NgramVerifyInput.generate_attn_arg_prefill",
    "sglang.srt.speculative.eagle_info.EagleVerifyInput.generate_attn_arg_prefill",
)


def verify_prefill_args_hook(original: Callable[..., Any], verify_input: Any, **kw: Any) -> Any:
    """AROUND ``NgramVerifyInput`` / ``EagleVerifyInput.generate_attn_arg_prefill``: ragged
    prefill arguments where the verify input carries per-request lengths (module doc)."""
    lens = getattr(verify_input, LENS_ATTR, None)
    seq_lens = getattr(verify_input, SEQ_LENS_ATTR, None)
    if lens is None or seq_lens is None:
        return original(verify_input, **kw)
    width = int(verify_input.draft_token_num)
    lens_np = np.asarray(lens, dtype=np.int64)
    seq_np = np.asarray(seq_lens, dtype=np.int64)[: lens_np.size]
    bs, total = lens_np.size, int(lens_np.sum())
    if lens_np.min(initial=1) < 1 or lens_np.max(initial=1) > width or seq_np.size != bs:
        raise ValueError(
            f"ragged verify lengths {lens_np.tolist()} for {seq_np.size} requests outside "
            f"1..{width}"
        )
    req_pool_indices = kw["req_pool_indices"]
    host = np.concatenate(
        [[0], np.cumsum(lens_np), [0], np.cumsum(seq_np + lens_np), seq_np + lens_np]
    ).astype(np.int32)
    dev = to_device(torch.from_numpy(host), req_pool_indices.device)
    qo_indptr, kv_indptr = dev[: bs + 1], dev[bs + 1 : 2 * bs + 2]
    kv_lens = dev[2 * bs + 2 :]
    kv_total = int(seq_np.sum()) + total
    kv_indices = torch.empty(kv_total, dtype=torch.int32, device=req_pool_indices.device)
    kw["translator"].pack_read_stream(
        kw["plan"],
        req_pool_indices=req_pool_indices,
        seq_lens=kv_lens,
        indptr=kv_indptr,
        out=kv_indices,
        kind=kw["kind"] if "kind" in kw else _full_kind(),
        # the gather tiled as the host's EAGLE verify tiles it, sized by a host int
        num_token_blocks=None,
        kv_lens_sum=kv_total,
    )
    custom_mask, _ = ragged_full_mask(verify_input.custom_mask, seq_np, lens_np, width)
    verify_input.qo_indptr = qo_indptr
    return kv_indices, kv_indptr, qo_indptr, custom_mask


def _full_kind() -> Any:
    from sglang.srt.mem_cache.kv_loc_plan import IdSpaceKind

    return IdSpaceKind.FULL


def install_flashinfer_ragged() -> list[str]:
    """Register the hook (inert unless a verify input carries per-request lengths)."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once(
        [(target, verify_prefill_args_hook, HookType.AROUND) for target in PREFILL_ARGS_TARGETS]
    )
    return ["flashinfer_ragged"]
