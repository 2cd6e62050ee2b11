"""Keep tensor-parallel ranks in lockstep: every rank verifies the same drafts.

Each TP rank runs its own scheduler, worker and drafter. Fed the same committed
tokens, the drafters agree; but a rank-local event (a drafting fault absorbed on one
rank only, a wall-clock-driven width or step-count choice, a draft-KV repair that
failed on one rank) would make ranks verify different shapes or tokens, or run a
forward the others do not: a hang in the collectives or corrupt output. The source
rank's decisions are broadcast over the TP group's CPU (gloo) process group, in the
lockstep order in which the TP schedulers run their batches.

The rule every caller follows: the collective is never inside the block that can
fail. A rank whose local work raised still takes part in the collective with a zeroed
contribution (no suffix rows, no repair, an empty draft), and the outcome every rank
acts on is the source rank's (or, for :meth:`TpSync.all_ok`, the agreement of all).
Nothing happens with a single TP rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class TpDraftError(RuntimeError):
    """The source rank could not produce this step's drafts; every rank raises it."""


class TpSync:
    """Broadcasts from the source rank (a global rank: the TP group's first) over the TP
    group's CPU (gloo) process group, once per decode step, every rank in the lockstep
    order in which the TP schedulers run their batches."""

    def __init__(self, cpu_group: Any, src: int) -> None:
        self.cpu_group = cpu_group
        self.src = src
        self._value = torch.zeros(1, dtype=torch.int64)

    @property
    def is_src(self) -> bool:
        """Whether this process is the source rank (whose decisions the others take)."""
        return torch.distributed.get_rank() == self.src

    def choice(self, value: int) -> int:
        """The source rank's integer decision (a verify width, a draft step count):
        every rank passes its own and gets the source rank's back."""
        self._value[0] = int(value)
        torch.distributed.broadcast(self._value, src=self.src, group=self.cpu_group)
        return int(self._value[0])

    def width(self, width: int) -> int:
        """The source rank's verify width (adaptive SUFFIX)."""
        return self.choice(width)

    def lengths(self, lens: np.ndarray) -> np.ndarray:
        """The source rank's per-request verify lengths (ragged verify): ``bs`` int64,
        every rank passes an array of its batch's size."""
        t = torch.from_numpy(np.ascontiguousarray(lens, dtype=np.int64)).clone()
        torch.distributed.broadcast(t, src=self.src, group=self.cpu_group)
        return t.numpy()

    def all_ok(self, ok: bool) -> bool:
        """True on every rank only if ``ok`` on every rank (a MIN all-reduce): a
        decision to run an extra forward (with its own collectives) taken together."""
        flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN, group=self.cpu_group)
        return bool(flag[0])

    def drafts(
        self, tokens: np.ndarray, mask: np.ndarray, ok: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """The source rank's draft tokens and tree mask (:meth:`drafts_flagged` without
        the emptiness flag)."""
        tokens, mask, _empty = self.drafts_flagged(tokens, mask, ok=ok)
        return tokens, mask

    def drafts_flagged(
        self, tokens: np.ndarray, mask: np.ndarray, ok: bool = True, empty: bool = False
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """The source rank's draft tokens, tree mask and whether none of its requests has
        a draft (``empty``: the step runs as a plain decode step on every rank). Cost per
        decode step: ``bs * width`` int64 tokens and ``bs * width * width`` mask bytes
        (about 70 kB at batch 256, width 16), plus one int64: whether the source rank's
        drafts are valid, and the emptiness flag. A rank whose own drafting failed
        passes ``ok=False`` with arrays of the right shape; if the source rank failed,
        every rank raises :class:`TpDraftError` together (no rank is left waiting in a
        collective the others skipped)."""
        t = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))
        m = torch.from_numpy(np.ascontiguousarray(mask).view(np.uint8))
        flags = self.choice((1 if ok else 0) | (2 if empty else 0))
        torch.distributed.broadcast(t, src=self.src, group=self.cpu_group)
        torch.distributed.broadcast(m, src=self.src, group=self.cpu_group)
        if not flags & 1:
            raise TpDraftError(
                f"TP source rank {self.src} could not draft this step; every rank stops it"
            )
        out_tokens = t.numpy().astype(tokens.dtype, copy=False)
        return out_tokens, m.numpy().view(mask.dtype), bool(flags & 2)


def tp_sync() -> TpSync | None:
    """The sync for the ranks that serve this process's requests, or None where it is
    alone: the TP group; under DP attention its attention-TP group (each attention-DP
    rank schedules, drafts and verifies its own requests; the ranks that agree are those
    that run its attention)."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if attn_dp_size(parallel) > 1:
        if int(parallel.attn_tp_size) <= 1:
            return None
        group = parallel.attn_tp_group
    elif parallel.tp_size <= 1:
        return None
    else:
        group = parallel.tp_group
    return TpSync(group.cpu_group, group.ranks[0])


def attn_dp_size(parallel: Any) -> int:
    """The host's attention-DP width; 1 where the context does not publish it (a context
    overridden with a TP size alone, in tests and tools)."""
    try:
        return int(parallel.attn_dp_size or 1)
    except Exception:  # noqa: BLE001 - not published
        return 1


def tp_sync_or_none() -> TpSync | None:
    """:func:`tp_sync` where a host runtime context may be missing (tests, tools):
    ``None`` without one."""
    try:
        return tp_sync()
    except Exception:  # noqa: BLE001 - no published parallel context: one rank
        return None
