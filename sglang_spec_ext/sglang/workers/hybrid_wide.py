"""HYBRID's wide steps in the host's EAGLE path: a suffix draft verified at its own length.

The decision (``hybrid/wide.py``) says a step verifies at ``W_s`` > the model's width
``W_m``. Then :meth:`WideStepsMixin._widen` replaces the model draft's verify input by
one of width ``W_s``: every row rewritten from the host copies the choice already holds
(suffix rows: the suffix tree; model rows: the model's tree read from its links, padded),
tokens, tree mask in the host's layout, positions and links (``verify/rows.py``), the
root column copied on the device. The worker's and its draft worker's
``speculative_num_draft_tokens`` are ``W_s`` for the rest of the step (the host's verify,
its commit bookkeeping and the draft extend read it: the draft extend then runs over
``W_s`` tokens per request) and restored when the step ends (:meth:`_narrow_back`, also
after a failure).

What makes it safe:

* KV: the scheduler reserves each request's KV for ``max_speculative_num_draft_tokens()``,
  which HYBRID's spec class raises to the suffix width (``spec_class.py``); the verify's
  KV slots are then assigned from ``seq_lens`` for ``W_s`` tokens as for any EAGLE verify;
* attention: wide steps run where the target's backend sizes its verify metadata from
  the batch's ``spec_info`` (``verify/widths.py``: flashinfer, triton, the CPU engine's
  torch_native); the verify and draft-extend CUDA graphs refuse a width they were not
  captured at, so a wide step runs both eagerly (the host's own fallback);
* exactness: the host verifies the wide input as any EAGLE tree (greedy or sampled);
  padding nodes (token 0, chained below a row's last node) are accepted only where the
  target itself predicts token 0;
* TP: every rank widens from the first rank's shared rows (``tp_sync``), so the width
  and rows agree.

Not wide (the suffix draft is cut to ``W_m - 1`` nodes as before, one start-up line
says why): another attention backend, rejection sampling with draft probabilities
(``--speculative-use-rejection-sampling``), a draft that plans its KV window
(``kv_loc_plan``), pipeline parallelism, or a suffix width at or below ``W_m``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np
import torch

from sglang_spec_ext.hybrid.wide import TokenCost, WideStats
from sglang_spec_ext.sglang.verify.rows import write_trees
from sglang_spec_ext.sglang.verify.tree_mask import FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING
from sglang_spec_ext.sglang.verify.widths import backend_name, reads_width_from_spec_info

logger = logging.getLogger("sglang_spec_ext")


def wide_problem(worker: Any, suffix_width: int, model_width: int) -> str | None:
    """Why ``worker`` (a HYBRID worker) cannot verify wide steps (None: it can)."""
    if suffix_width <= model_width:
        return (
            f"SGLANG_SPEC_EXT_HYBRID_SUFFIX_WIDTH={suffix_width} is at or below the model's "
            f"verify width {model_width}"
        )
    backend = getattr(getattr(worker.target_worker, "model_runner", None), "attn_backend", None)
    if backend is not None and not reads_width_from_spec_info(backend):
        return (
            f"the target's {backend_name(backend)} sizes its verify metadata at start-up "
            "(use --attention-backend triton or flashinfer)"
        )
    from sglang.srt.runtime_context import get_parallel, get_spec

    if getattr(get_spec(), "speculative_use_rejection_sampling", False):
        return "--speculative-use-rejection-sampling verifies with the model's draft probabilities"
    if getattr(get_parallel(), "pp_size", 1) > 1:
        return "pipeline parallelism relays the model's chains between stages"
    return None


def _new_mask(mode: int, bs: int, width: int, seq_lens_cpu: Any, device: Any) -> torch.Tensor:
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
        custom_mask=_new_mask(mask_mode, bs, width, seq_lens_cpu, device),
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


class WideStepsMixin:
    """Wide steps for :class:`~.hybrid_worker.HybridMixin` (see the module doc)."""

    speculative_num_draft_tokens: int

    def _init_wide(self, suffix_width: int, cost_prior: float) -> None:
        self._wide_width = suffix_width  # 0 once wide steps turn out impossible
        self._wide_resolved = False
        self._wide_cost = TokenCost(cost_prior)
        self._wide_stats = WideStats()
        self._narrowed: tuple[int, int] | None = None  # the widths a wide step replaced
        self._step_width = int(self.speculative_num_draft_tokens)
        self._timed: tuple[int, float, int] | None = None  # (bs, start, verify tokens)

    def _pack_width(self) -> int:
        """Columns of this step's packed rows: the suffix width where wide steps can run."""
        return max(int(self.speculative_num_draft_tokens), self._wide_width)

    def _resolve_wide(self) -> None:
        """At the first decode step (the backends exist): one line, wide steps or why not."""
        if self._wide_resolved:
            return
        self._wide_resolved = True
        model = int(self.speculative_num_draft_tokens)
        problem = wide_problem(self, self._wide_width, model)
        if problem is not None:
            self._wide_width = 0
            logger.info("HYBRID: suffix drafts cut to the model's verify width %d: %s", model,
                        problem)  # fmt: skip
            return
        logger.info("HYBRID: a winning suffix draft keeps up to %d tokens (wide steps verify "
                    "at up to width %d where the extra tokens pay; eager verify and draft "
                    "extend there)", self._wide_width - 1, self._wide_width)  # fmt: skip

    def _time_step(self, batch: Any) -> None:
        """The previous decode step's wall time (to this step's start, same batch size)."""
        prev, self._timed = self._timed, None
        if prev is None or not batch.forward_mode.is_decode():
            return
        bs, start, tokens = prev
        if bs == len(batch.reqs):
            self._wide_cost.on_step(tokens, time.perf_counter() - start)

    def _widen(self, batch: Any, vi: Any, tokens: np.ndarray, masks: np.ndarray) -> Any:
        """The step's verify input at the width of ``tokens``; the worker and its draft
        worker at that width until :meth:`_narrow_back`."""
        wide = build_wide_input(vi, batch, tokens, masks, int(self._mask_mode()))
        draft = self._draft_worker
        self._narrowed = (int(self.speculative_num_draft_tokens),
                          int(draft.speculative_num_draft_tokens))  # fmt: skip
        width = tokens.shape[1]
        self.speculative_num_draft_tokens = width
        draft.speculative_num_draft_tokens = width
        return wide

    def _narrow_back(self) -> None:
        narrowed, self._narrowed = self._narrowed, None
        if narrowed is not None:
            self.speculative_num_draft_tokens = narrowed[0]
            self._draft_worker.speculative_num_draft_tokens = narrowed[1]

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        decode = not (batch.forward_mode.is_extend() or batch.is_extend_in_batch)
        if decode:
            self._time_step(batch)
            self._step_width = int(self.speculative_num_draft_tokens)
        else:  # a prefill between two decode steps is no decode step's time
            self._timed = None
        start = time.perf_counter()
        try:
            return super().forward_batch_generation(batch, *args, **kwargs)  # type: ignore[misc]
        finally:
            self._narrow_back()
            if decode and not batch.forward_mode.is_idle() and batch.reqs:
                self._timed = (len(batch.reqs), start, len(batch.reqs) * self._step_width)

    def wide_stats(self) -> dict[str, Any]:
        return {"suffix_width": self._wide_width, **self._wide_stats.as_dict(),
                **self._wide_cost.stats()}  # fmt: skip
