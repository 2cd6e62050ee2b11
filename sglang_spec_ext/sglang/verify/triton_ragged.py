"""Ragged tree verify on the host's triton attention backend.

The host's ``TritonAttnBackend`` runs a target verify as an extend: per request, its
verify tokens are the extend part (queries ``qo_indptr``, their own K/V passed in), its
committed tokens the prefix (``kv_indptr`` / ``kv_indices``), and a tree mask in the
FULL_MASK layout (per request ``n`` rows of ``seq_len + n`` columns, ``mask_indptr``)
says which tokens each verify token sees. The kernel itself is ragged (``qo_indptr`` may
differ per request); only the metadata the host builds for a verify is uniform: ``W``
rows per request, a ``W``-wide mask. SGLang 0.5.23 has no ragged verify for triton
(``supports_ragged_verify_graph`` False, no layout read).

:func:`triton_metadata_hook` (AROUND ``TritonAttnBackend.init_forward_metadata``) makes
it ragged where a SUFFIX (or HYBRID wide-step) verify carries per-request lengths
(``ragged_lens_cpu``, ``ragged_backends.py``'s tree route): after the host built the
uniform metadata, the query offsets become the lengths' (``[0, L_0, L_0 + L_1, ...]``),
the longest extend ``max L_i``, and the mask is cut to each request's ``L_i`` rows of
``seq_len + L_i`` columns (its prefix columns and its first ``L_i`` draft columns: the
draft's real nodes, in order) with ``mask_indptr`` to match. The prefix part is
unchanged. Trees and chains alike; eager only (the verify graphs are captured for
``bs x W`` tokens and the host's runner sends a compact batch eager). Not where the
host's deterministic mode runs its unified kernel (it assumes one width) or with
sliding-window layers (``ragged_backends.py``: ``triton_ragged_problem`` keeps those padded).

No host sync: the lengths and the committed lengths are host values (the batch's
``seq_lens_cpu``); the index arrays go to the device in one non-blocking copy and the
mask gather is sized on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from sglang_spec_ext.sglang.verify.ragged_backends import LENS_ATTR, to_device
from sglang_spec_ext.verify.layout import index_within

#: The host method the hook wraps.
METADATA_TARGET = (
    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata"
)


def ragged_full_mask_plan(
    seq_lens: np.ndarray, lens: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host index arrays of the FULL_MASK cut (see the module doc): per kept row, its start
    in the ``width``-wide mask less its start in the ragged mask, and its length; and the
    ragged mask's ``mask_indptr`` (its last entry the ragged mask's size)."""
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    lens = np.asarray(lens, dtype=np.int64)
    padded_start = np.concatenate([[0], np.cumsum(width * (seq_lens + width))[:-1]])
    indptr = np.concatenate([[0], np.cumsum(lens * (seq_lens + lens))])
    row = index_within(lens)
    src = np.repeat(padded_start, lens) + row * np.repeat(seq_lens + width, lens)
    dst = np.repeat(indptr[:-1], lens) + row * np.repeat(seq_lens + lens, lens)
    return src - dst, np.repeat(seq_lens + lens, lens), indptr


def ragged_full_mask(
    mask: torch.Tensor, seq_lens: np.ndarray, lens: np.ndarray, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The FULL_MASK ``mask`` of a ``width``-wide verify cut to ``lens`` rows per request:
    ``(ragged mask, mask_indptr)``."""
    offset, row_len, indptr = ragged_full_mask_plan(seq_lens, lens, width)
    rows, total = offset.size, int(indptr[-1])
    dev = to_device(torch.from_numpy(np.concatenate([offset, row_len, indptr])), mask.device)
    offset_dev, row_len_dev, indptr_dev = dev[:rows], dev[rows : 2 * rows], dev[2 * rows :]
    # Element e of kept row r sits at dst_r + j in the ragged mask and src_r + j in the
    # padded one: its source is e + (src_r - dst_r).
    index = torch.arange(total, device=mask.device) + torch.repeat_interleave(
        offset_dev, row_len_dev, output_size=total
    )
    return mask.reshape(-1)[index], indptr_dev


def triton_metadata_hook(original: Callable[..., Any], backend: Any, forward_batch: Any) -> Any:
    """AROUND ``TritonAttnBackend.init_forward_metadata``: a verify carrying per-request
    lengths gets ragged query offsets and a ragged tree mask (module doc)."""
    out = original(backend, forward_batch)
    spec_info = forward_batch.spec_info
    lens = getattr(spec_info, LENS_ATTR, None) if spec_info is not None else None
    if lens is None or not forward_batch.forward_mode.is_target_verify():
        return out
    md = backend.forward_metadata
    width = int(md.max_extend_len)
    seq_lens = forward_batch.seq_lens_cpu
    if seq_lens is None:  # the host keeps a host copy for speculative batches; else read
        seq_lens = forward_batch.seq_lens.cpu()
    seq_lens = np.asarray(seq_lens[: len(lens)], dtype=np.int64)
    lens_np = np.asarray(lens, dtype=np.int64)
    if md.custom_mask is not None:
        md.custom_mask, md.mask_indptr = ragged_full_mask(md.custom_mask, seq_lens, lens_np, width)
    qo = np.concatenate([[0], np.cumsum(lens_np)]).astype(np.int32)
    md.qo_indptr = to_device(torch.from_numpy(qo), md.qo_indptr.device)
    md.max_extend_len = int(lens_np.max())
    return out


def install_triton_ragged() -> list[str]:
    """Register the hook (inert unless a verify carries per-request lengths)."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once([(METADATA_TARGET, triton_metadata_hook, HookType.AROUND)])
    return ["triton_ragged"]
