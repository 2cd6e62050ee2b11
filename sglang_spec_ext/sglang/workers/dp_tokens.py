"""DP attention: every rank's real token count for the gathered MLP of each forward.

Under DP attention (``--enable-dp-attention`` / ``--attn-dp-size N``) each attention-DP
rank schedules its own requests, and the MLP layers run over every rank's tokens at once
(gathered). The scheduler exchanges each rank's count before the step
(``scheduler_components/dp_attn.py``): for a decode batch, its request count, which the
forward scales by the verify input's tokens per request (``spec_scale_global_num_tokens``).
That holds only when every rank verifies at one width. A SUFFIX rank does not: it may
verify at its own adaptive width, an idle rank has no verify input to scale by (it reads
its peers' request counts unscaled), and a rank that prefills while a peer verifies is
scaled by the peer's width. The buffers of the gathered MLP would then disagree.

:class:`DpTokenCounts` exchanges the counts the forward really runs, after this rank's
drafts fixed its shape, and writes them where the host reads them, marked as already
scaled (the host's own ``dp_spec_prefill_coordination`` plan does the same for EAGLE):
``global_num_tokens`` / ``global_num_tokens_for_logprob`` and
``dp_spec_prefill_coordination_applied``. One all-gather of two integers over the TP
group's CPU (gloo) group per forward, on every rank in the lockstep order of the
schedulers' forwards (each rank runs exactly one forward per scheduler iteration under DP
attention, idle ranks included). No device sync: the counts are host values.
"""

from __future__ import annotations

from typing import Any

import torch


class DpTokenCounts:
    """Exchanges each attention-DP rank's forward token count (see the module doc).

    ``cpu_group``: the TP group's gloo group, whose ranks are laid out
    ``(attn_dp_rank * attn_cp_size + attn_cp_rank) * attn_tp_size + attn_tp_rank``;
    ``stride``: ``attn_tp_size * attn_cp_size`` (one entry per attention-DP rank is kept,
    its first rank's: the others run the same batch)."""

    def __init__(self, cpu_group: Any, world: int, stride: int, dp_rank: int) -> None:
        self.cpu_group = cpu_group
        self.world = world
        self.stride = stride
        self.dp_rank = dp_rank

    def apply(self, batch: Any, tokens: int | None) -> None:
        """Set ``batch``'s per-rank counts to what every rank's forward runs this step.
        ``tokens``: this rank's verify tokens (a speculative decode step), or None for a
        forward the scheduler already counted in tokens (prefill, idle)."""
        counts = getattr(batch, "global_num_tokens", None)
        if counts is None:
            return  # no MLP sync this step (the scheduler gathered nothing)
        logprob = getattr(batch, "global_num_tokens_for_logprob", None) or counts
        if tokens is None:
            own = counts[self.dp_rank] if len(counts) > 1 else counts[0]
            own_logprob = logprob[self.dp_rank] if len(logprob) > 1 else logprob[0]
            local = (int(own), int(own_logprob))
        else:
            local = (int(tokens), int(tokens))
        if len(counts) == 1:  # a local-only gather (the MoE backend needs no peers' counts)
            tokens_all, logprob_all = [local[0]], [local[1]]
        else:
            rows = self._all_gather(local)
            tokens_all = [int(r[0]) for r in rows]
            logprob_all = [int(r[1]) for r in rows]
        batch.global_num_tokens = tokens_all
        batch.global_num_tokens_for_logprob = logprob_all
        batch.dp_spec_prefill_coordination_applied = True  # already in tokens: not rescaled

    def _all_gather(self, local: tuple[int, int]) -> list[torch.Tensor]:
        mine = torch.tensor(local, dtype=torch.int64)
        out = [torch.empty(2, dtype=torch.int64) for _ in range(self.world)]
        torch.distributed.all_gather(out, mine, group=self.cpu_group)
        return out[:: self.stride]


def dp_token_counts() -> DpTokenCounts | None:
    """The exchange for this process, or None without DP attention."""
    from sglang.srt.runtime_context import get_parallel

    from sglang_spec_ext.sglang.workers.tp_sync import attn_dp_size

    parallel = get_parallel()
    if attn_dp_size(parallel) <= 1:
        return None
    group = parallel.tp_group
    stride = int(parallel.attn_tp_size) * int(getattr(parallel, "attn_cp_size", 1) or 1)
    return DpTokenCounts(group.cpu_group, int(parallel.tp_size), stride,
                         int(parallel.attn_dp_rank))  # fmt: skip
