"""The padded ``[bs * W, ...]`` rows a ragged verify hands back to the host's verify.

The target computes only each request's own rows (``verify/ragged.py``); the host's
verify (``eagle_sample``: penalties, grammar masks, greedy argmax or tree sampling, in
place) reads ``bs * W`` rows of logits, the padding rows zero (unreachable). On a GPU a
fresh tensor comes from torch's caching allocator. On a CPU a fresh tensor of that size
(16 requests x width 16 x a 49k vocabulary: 50 MB) is a new ``mmap`` each step, and
filling it page-faults every 4 KiB page: tens of milliseconds a step on the CPU engine,
more than the forward saves at batch 16. So on a CPU the rows go into persistent buffers,
a ring of :data:`RING` per row shape: a step's logits stay untouched while the scheduler
still reads that step's result (overlap scheduling processes step N's result while step
N + 1 runs; the buffer comes round again at step N + 3). Zeroing a mapped buffer is a
plain memset. Logits only: hidden states (returned to requests that ask for them) may
outlive the step, so they stay fresh tensors. Bound: :data:`RING` buffers per (dtype, row
shape), each as large as the largest batch verified, at most ``max_running_requests x W``
rows.
"""

from __future__ import annotations

import torch

#: Buffers per row shape: the step being verified, the one whose result the scheduler may
#: still be reading under overlap, and one spare.
RING = 3


class PaddedRows:
    """Scatter compact rows back to padded ones (see the module doc)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._turn: dict[tuple, int] = {}

    def scatter(
        self, compact: torch.Tensor, keep: torch.Tensor, rows: int, reuse: bool = True
    ) -> torch.Tensor:
        """``compact``'s first ``keep.numel()`` rows at rows ``keep`` of a ``rows``-row
        tensor, the others zero (a token bucket's padding rows past ``keep`` dropped).
        ``reuse=False``: a fresh tensor (rows the host may keep past the step)."""
        shape = (rows, *compact.shape[1:])
        if compact.device.type != "cpu" or not reuse:
            full = compact.new_zeros(shape)
        else:
            full = self._take(compact, shape)
            full.zero_()
        full.index_copy_(0, keep, compact[: keep.numel()])
        return full

    def _take(self, like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        kind = (like.dtype, tuple(shape[1:]))
        turn = self._turn.get(kind, 0)
        self._turn[kind] = (turn + 1) % RING
        buffer = self._buffers.get((kind, turn))
        if buffer is None or buffer.shape[0] < shape[0]:
            buffer = like.new_empty(shape)
            self._buffers[(kind, turn)] = buffer
        return buffer[: shape[0]]

    def clear(self) -> None:
        self._buffers.clear()
        self._turn.clear()
