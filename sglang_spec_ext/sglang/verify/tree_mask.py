"""Draft trees written into the host's tree mask, in each of its layouts (``tree_mask_mode``).

Used on every device: the CPU engine's tree-building fallback (``cpu/fallbacks/ops.py``)
and HYBRID's verify rows (``verify/rows.py``) write masks with it.
"""

from __future__ import annotations

import torch

#: The host's tree-mask layouts: ``TreeMaskMode`` of ``sglang.kernels.ops.speculative.spec_tree``.
FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """A writable 1-D view of ``t`` (1-D tensors keep their stride)."""
    return t if t.dim() == 1 else t.view(-1)


def write_tree_mask(
    tree_mask: torch.Tensor,
    rows: torch.Tensor,
    seq_len: torch.Tensor,
    mode: int,
    which: torch.Tensor | None = None,
) -> None:
    """Store the ``[k, n, n]`` draft part of the tree mask in the host's layout.

    ``seq_len`` covers the whole batch; ``rows`` are its requests ``which`` (default:
    all of them, in order), so a caller can rewrite some requests' trees in place.
    """
    k, n, _ = rows.shape
    device = rows.device
    node = torch.arange(n, device=device)
    if which is None:
        which = torch.arange(k, device=device)
    which = which.to(device=device, dtype=torch.int64)
    if mode == QLEN_ONLY_BITPACKING:
        if n > 32:
            raise ValueError("QLEN_ONLY_BITPACKING supports at most 32 draft tokens")
        width = 4 if n > 16 else (2 if n > 8 else 1)
        packed = (rows.to(torch.int64) << node).sum(-1).reshape(-1)  # [k * n]
        shifts = torch.arange(width, device=device) * 8
        parts = (packed[:, None] >> shifts) & 0xFF  # [k * n, width] bytes, little endian
        flat = tree_mask.view(torch.uint8).view(-1)
        start = (which[:, None] * n + node).reshape(-1) * width
        old = flat[start[:, None] + torch.arange(width, device=device)].to(torch.int64)
        old[:, 0] = 0  # the kernel assigns byte 0 and ORs into the others
        flat[(start[:, None] + torch.arange(width, device=device)).reshape(-1)] = (
            (old | parts).reshape(-1).to(torch.uint8)
        )
        return
    if mode == FULL_MASK:
        before = (torch.cumsum(seq_len, 0) - seq_len)[which]
        own = seq_len[which]
        base = n * n * which + n * before  # [k]
        start = base[:, None] + (own[:, None] + n) * node + own[:, None]  # [k, i]
    elif mode == QLEN_ONLY:
        start = n * (n * which[:, None] + node)
    else:
        raise ValueError(f"unknown tree_mask_mode {mode}")
    flat = flat_view(tree_mask)
    flat[(start[:, :, None] + node).reshape(-1)] = rows.reshape(-1).to(flat.dtype)
