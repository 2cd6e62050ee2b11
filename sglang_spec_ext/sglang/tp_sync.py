"""Keep tensor-parallel ranks in lockstep: every rank verifies the same drafts.

Each TP rank runs its own scheduler, worker and drafter. Fed the same committed
tokens, the drafters agree; but a rank-local event (a drafting fault absorbed on one
rank only, a wall-clock-driven width choice) would make ranks verify different shapes
or tokens: a hang in the collectives or corrupt output. The source rank's decisions
are broadcast over the TP group's CPU (gloo) process group, in the lockstep order in
which the TP schedulers run their batches. Nothing happens with a single TP rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class TpWidthSync:
    """Every TP rank verifies at the same width: the source rank's choice (one int64)."""

    def __init__(self, cpu_group: Any, src: int) -> None:
        self.cpu_group = cpu_group
        self.src = src
        self._buf = torch.zeros(1, dtype=torch.int64)

    def __call__(self, width: int) -> int:
        self._buf[0] = width
        torch.distributed.broadcast(self._buf, src=self.src, group=self.cpu_group)
        return int(self._buf[0])


class TpDraftSync:
    """Every TP rank verifies the source rank's draft tokens and tree mask.

    Cost per decode step: one broadcast of ``bs * width`` int64 tokens and
    ``bs * width * width`` mask bytes (about 70 kB at batch 256, width 16).
    """

    def __init__(self, cpu_group: Any, src: int) -> None:
        self.cpu_group = cpu_group
        self.src = src

    def __call__(self, tokens: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))
        m = torch.from_numpy(np.ascontiguousarray(mask).view(np.uint8))
        torch.distributed.broadcast(t, src=self.src, group=self.cpu_group)
        torch.distributed.broadcast(m, src=self.src, group=self.cpu_group)
        return t.numpy().astype(tokens.dtype, copy=False), m.numpy().view(mask.dtype)


def tp_source() -> tuple[Any, int] | None:
    """(the TP group's CPU group, its first global rank), or None with one TP rank."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if parallel.tp_size <= 1:
        return None
    group = parallel.tp_group
    return group.cpu_group, group.ranks[0]
