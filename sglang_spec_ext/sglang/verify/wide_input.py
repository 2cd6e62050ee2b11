"""A model draft's verify input rebuilt wider: HYBRID's wide steps (``workers/hybrid_wide.py``).

A wide step verifies at ``W_s``, wider than the model draft's ``W_m``: the host's
``EagleVerifyInput`` of the model's chains is replaced by one ``W_s`` wide, every
request's row written from host copies (``verify/rows.py``: tokens, the tree mask in the
host's layout, positions, links), the root (each request's last committed token) copied on
the device.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from sglang_spec_ext.sglang.verify.rows import write_trees
from sglang_spec_ext.sglang.verify.tree_mask import FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING


def new_mask(mode: int, bs: int, width: int, seq_lens_cpu: Any, device: Any) -> torch.Tensor:
    """A tree mask of ``width`` nodes per request in the host's layout ``mode``, its
    context-prefix columns set (FULL_MASK) and its draft part left for ``write_trees``."""
    if mode == QLEN_ONLY:
        return torch.zeros((bs * width * width,), dtype=torch.bool, device=device)
    if mode == QLEN_ONLY_BITPACKING:
        if width > 32:
            raise ValueError("QLEN_ONLY_BITPACKING holds at most 32 verify tokens")
        dtype = (torch.uint8, torch.uint16, torch.uint32)[
            int(math.ceil(math.log2((width + 7) // 8)))
        ]
        return torch.zeros((bs * width,), dtype=dtype, device=device)
    if mode == FULL_MASK:
        total = int(seq_lens_cpu.sum())  # a host tensor: no device read
        return torch.ones((total * width + width * width * bs,), dtype=torch.bool, device=device)
    raise ValueError(f"unknown tree_mask_mode {mode}")


def build_wide_input(
    vi: Any, batch: Any, tokens: np.ndarray, masks: np.ndarray, mask_mode: int
) -> Any:
    """The verify input ``vi`` (the model draft's, ``W_m`` wide) rebuilt at the width of
    ``tokens`` ([bs, W_s], root column ignored) and ``masks`` ([bs, W_s, W_s] ancestor
    masks): every request's row written, the root (its last committed token) kept."""
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    bs, width = tokens.shape
    device = vi.draft_token.device
    seq_lens_cpu = getattr(batch, "seq_lens_cpu", None)
    if seq_lens_cpu is None:
        seq_lens_cpu = vi.seq_lens_cpu
    if mask_mode == FULL_MASK and seq_lens_cpu is None:
        raise ValueError("a FULL_MASK wide verify needs the batch's host sequence lengths")
    draft = torch.zeros((bs, width), dtype=vi.draft_token.dtype, device=device)
    draft[:, 0] = vi.draft_token.view(bs, -1)[:, 0]
    index = torch.arange(bs * width, dtype=vi.retrieve_index.dtype, device=device)
    links = torch.full((2, bs, width), -1, dtype=vi.retrieve_next_token.dtype, device=device)
    wide = EagleVerifyInput(
        draft_token=draft.view(-1),
        custom_mask=new_mask(mask_mode, bs, width, seq_lens_cpu, device),
        positions=torch.zeros((bs * width,), dtype=vi.positions.dtype, device=device),
        retrieve_index=index.view(bs, width),
        retrieve_next_token=links[0],
        retrieve_next_sibling=links[1],
        retrieve_cum_len=vi.retrieve_cum_len,
        spec_steps=int(vi.spec_steps),
        topk=vi.topk,
        draft_token_num=width,
        capture_hidden_mode=vi.capture_hidden_mode,
        seq_lens_sum=vi.seq_lens_sum,
        seq_lens_cpu=vi.seq_lens_cpu,
    )
    write_trees(wide, batch.seq_lens, list(range(bs)), tokens, masks, mask_mode)
    return wide
