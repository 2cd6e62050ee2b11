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


class TpSync:
    """Broadcasts from the source rank (a global rank: the TP group's first) over the TP
    group's CPU (gloo) process group, once per decode step, every rank in the lockstep
    order in which the TP schedulers run their batches."""

    def __init__(self, cpu_group: Any, src: int) -> None:
        self.cpu_group = cpu_group
        self.src = src
        self._width = torch.zeros(1, dtype=torch.int64)

    def width(self, width: int) -> int:
        """The source rank's verify width (adaptive SUFFIX: one int64)."""
        self._width[0] = width
        torch.distributed.broadcast(self._width, src=self.src, group=self.cpu_group)
        return int(self._width[0])

    def drafts(self, tokens: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The source rank's draft tokens and tree mask. Cost per decode step: ``bs * width``
        int64 tokens and ``bs * width * width`` mask bytes (about 70 kB at batch 256,
        width 16)."""
        t = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))
        m = torch.from_numpy(np.ascontiguousarray(mask).view(np.uint8))
        torch.distributed.broadcast(t, src=self.src, group=self.cpu_group)
        torch.distributed.broadcast(m, src=self.src, group=self.cpu_group)
        return t.numpy().astype(tokens.dtype, copy=False), m.numpy().view(mask.dtype)


def tp_sync() -> TpSync | None:
    """The sync for this process's TP group, or None with a single TP rank."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if parallel.tp_size <= 1:
        return None
    group = parallel.tp_group
    return TpSync(group.cpu_group, group.ranks[0])
