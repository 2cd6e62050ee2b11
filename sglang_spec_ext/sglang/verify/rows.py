"""Draft trees in and out of the host's EAGLE verify input (``EagleVerifyInput``), per request.

:func:`read_tree` reads one request's draft tree from the host's first-child /
next-sibling links; :func:`write_trees` writes trees into some requests' rows: tokens,
tree mask (in the host's layout: FULL_MASK, QLEN_ONLY or bit-packed), positions and
links, leaving the other rows and the prefix columns of the mask as the host wrote them.
HYBRID (``hybrid_worker.py``) uses them to put suffix drafts where they win.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sglang_spec_ext.sglang.verify.tree_mask import write_tree_mask
from sglang_spec_ext.verify.layout import links_from_parents, parents_from_masks


def read_tree(
    tokens: list[int], next_token: list[int], next_sibling: list[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(tokens, parents) of the draft nodes of a host verify row (root at index 0) that
    the verifier can reach from the root through the links."""
    parent: dict[int, int] = {}
    frontier = [0]
    while frontier:
        node = frontier.pop()
        child, hops = next_token[node], 0
        while 0 < child < len(tokens) and child not in parent and hops < len(tokens):
            parent[child] = node
            frontier.append(child)
            child, hops = next_sibling[child], hops + 1
    order = sorted(parent)  # host nodes are topologically ordered by index
    index = {node: i for i, node in enumerate(order)}
    parents = tuple(index[parent[n]] if parent[n] else -1 for n in order)
    return tuple(tokens[n] for n in order), parents


def write_trees(
    vi: Any,
    seq_lens: torch.Tensor,
    rows: list[int],
    tokens: np.ndarray,
    masks: np.ndarray,
    mask_mode: int,
) -> None:
    """Write trees into the requests ``rows`` of the verify input ``vi``.

    ``tokens[b]`` ([bs, W], root first, padding included) and ``masks[b]`` ([bs, W, W]
    ancestor masks) describe request ``b``'s tree (its root token is not written: the
    host's root, the request's last committed token, stays); ``seq_lens`` are the whole batch's
    committed lengths. ``spec_steps`` is raised to the deepest tree written (the host
    sizes its accepted-path rows by it).
    """
    width = tokens.shape[1]
    device = vi.draft_token.device
    seq_lens = seq_lens.to(device=device, dtype=torch.int64)
    which = torch.tensor(rows, dtype=torch.int64, device=device)
    sel_masks = masks[rows]  # [k, W, W]
    nt, ns = links_from_parents(parents_from_masks(sel_masks))
    depth_host = sel_masks.sum(-1) - 1  # [k, W] on the host: no device read below
    depth = torch.from_numpy(depth_host).to(device)
    flat = (which[:, None] * width + torch.arange(width, device=device)).reshape(-1)
    # the root (column 0) stays the host's: the request's last committed token
    nodes = (which[:, None] * width + torch.arange(1, width, device=device)).reshape(-1)
    vi.draft_token.view(-1)[nodes] = torch.from_numpy(tokens[rows][:, 1:].reshape(-1)).to(
        device=device, dtype=vi.draft_token.dtype
    )
    vi.positions.view(-1)[flat] = (
        (seq_lens[which][:, None] + depth).reshape(-1).to(vi.positions.dtype)
    )
    vi.retrieve_next_token.view(-1, width)[which] = torch.from_numpy(nt).to(
        device=device, dtype=vi.retrieve_next_token.dtype
    )
    vi.retrieve_next_sibling.view(-1, width)[which] = torch.from_numpy(ns).to(
        device=device, dtype=vi.retrieve_next_sibling.dtype
    )
    write_tree_mask(vi.custom_mask, torch.from_numpy(sel_masks).to(device), seq_lens, mask_mode,
                    which)  # fmt: skip
    deepest = int(depth_host.max())
    if deepest > vi.spec_steps:
        vi.spec_steps = deepest
