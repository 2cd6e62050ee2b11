"""How the SUFFIX worker's ranks agree: TP ranks on drafts, DP-attention ranks on tokens.

Each rank runs its own scheduler, worker and drafter. The ranks that serve the same
requests (the TP group; under DP attention, each attention-TP group) must verify the same
drafts: every rank verifies its first rank's (``tp_sync.TpSync``), and a rank whose own
drafting failed still takes part in the broadcast. Under DP attention the attention-DP
ranks serve different requests, and every forward's real token count per rank is
exchanged for the gathered MLP (``dp_tokens.DpTokenCounts``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sglang_spec_ext.sglang.workers.dp_tokens import DpTokenCounts
from sglang_spec_ext.sglang.workers.suffix_relay import last_token, relayed_per_request
from sglang_spec_ext.sglang.workers.tp_sync import TpDraftError, TpSync
from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.verify.layout import pack_batch


class RanksMixin:
    """Draft agreement over TP ranks and token counts over DP-attention ranks for a
    SUFFIX worker, which sets ``_tp_sync`` and ``_dp_tokens`` (None where alone)."""

    _tp_sync: TpSync | None
    _dp_tokens: DpTokenCounts | None
    draft_token_num: int
    enable_overlap: bool

    def _prepare_draft_tokens(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        staged, self._staged = getattr(self, "_staged", None), None
        if staged is not None:  # drafted by forward_batch_generation for this step
            return staged
        if self._tp_sync is None:
            return self._local_drafts(batch)
        # TP: every rank verifies the first rank's drafts. The broadcast stays outside
        # the block that can fail: a rank whose drafting raised takes part with a zeroed
        # contribution; if the first rank failed, every rank plain-decodes the step.
        ok = True
        width = self.draft_token_num
        lens = np.full(len(batch.reqs), width, dtype=np.int64)
        try:
            tokens, mask = self._local_drafts(batch)
            if self._ragged is not None:
                lens = self._ragged.pending_lens(len(batch.reqs), width)
        except Exception as exc:
            self._fault("prepare", None, exc)
            ok = False
            tokens = np.zeros((len(batch.reqs) * width,), dtype=np.int64)
            mask = np.zeros((len(batch.reqs) * width * width,), dtype=bool)
            self._step_empty = True
        try:
            tokens, mask, self._step_empty = self._tp_sync.drafts_flagged(
                tokens, mask, ok=ok, empty=self._step_empty
            )
            if self._ragged is not None:  # the first rank's lengths, on every rank
                self._ragged.set_lens(self._tp_sync.lengths(lens))
            return tokens, mask
        except TpDraftError as exc:
            self._fault("tp-source", None, exc)
            return self._root_only_drafts(batch)

    def _root_only_drafts(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        """Empty drafts (plain decoding through the verify path) for the whole batch:
        the roots only, the same on every TP rank (they hold the same committed tokens)."""
        prevs = relayed_per_request(batch, self.enable_overlap)
        roots = [last_token(req, prev) for req, prev in zip(batch.reqs, prevs, strict=True)]
        self._step_empty = True
        trees = [DraftTree() for _ in roots]
        self._set_lens(trees)
        return pack_batch(trees, roots, self.draft_token_num)

    def _exchange_dp_tokens(self, batch: Any) -> None:
        """Under DP attention, every rank's token count of this forward (a decode step's
        verify: its requests times its width; a prefill or idle forward: the scheduler's
        count), before the forward. Each rank runs one forward per scheduler step under DP
        attention, so the exchange stays in lockstep; plain, narrow and ragged steps are
        off there (the plain step refuses DP attention, ragged verify is padded)."""
        if self._dp_tokens is None:
            return
        decode = batch.forward_mode.is_decode() and bool(batch.reqs)
        self._dp_tokens.apply(batch, len(batch.reqs) * self.draft_token_num if decode else None)
