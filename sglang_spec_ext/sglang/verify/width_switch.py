"""Switching a SUFFIX worker's verify width between decode steps.

The host's NGRAM worker keeps preallocated draft buffers sized by ``draft_token_num``
and the target verifies at the width its attention backend (and graph runner) was
built for. Two SUFFIX workers change the width per step:

* adaptive SUFFIX (``adaptive_worker.py``): the controller's width, every step;
* fixed-width SUFFIX under CUDA graphs (``suffix_worker.py``): a step with no draft
  for any request verifies at width 1 on width-1 verify graphs (a decode-shaped
  replay) instead of the startup width's graphs with ``W - 1`` padding rows per
  request.

:class:`WidthSwitchMixin` holds what both need: one set of NGRAM buffers per width
(built lazily with the host's own ``_init_preallocated_tensors``), the target's verify
backend and graph runner per width (``verify_width.VerifyWidthBackends``), and the
overlap relay padded back to the startup width, which the host's future map is sized
for (and which every relayed row stride assumes).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_spec_ext.sglang.verify.widths import VerifyWidthBackends

# NGRAMWorker attributes that depend on draft_token_num (built by _init_preallocated_tensors).
WIDTH_BUFFERS = (
    "draft_tokens",
    "retrieve_indexes",
    "retrieve_next_token",
    "retrieve_next_sibling",
    "positions",
    "tree_mask",
    "draft_tokens_batch",
    "tree_mask_batch",
    "retrieve_indexes_batch",
    "retrieve_next_token_batch",
    "retrieve_next_sibling_batch",
    "positions_batch",
)


class WidthSwitchMixin:
    """Per-width buffers, verify backends and relay padding (see the module doc).

    The worker sets ``max_width`` (its startup width), ``_width_buffers = {}`` and
    ``_verify_backends = None`` before its first step."""

    max_width: int
    draft_token_num: int
    speculative_num_draft_tokens: int
    _width_buffers: dict[int, dict[str, Any]]
    _verify_backends: VerifyWidthBackends | None

    def _init_preallocated_tensors(self) -> None:
        super()._init_preallocated_tensors()  # type: ignore[misc]
        self._width_buffers[self.draft_token_num] = {a: getattr(self, a) for a in WIDTH_BUFFERS}

    def _use_width(self, width: int) -> None:
        if width not in self._width_buffers:
            self.draft_token_num = width
            super()._init_preallocated_tensors()  # type: ignore[misc]
            self._width_buffers[width] = {a: getattr(self, a) for a in WIDTH_BUFFERS}
        for name, value in self._width_buffers[width].items():
            setattr(self, name, value)
        self.draft_token_num = width
        self.speculative_num_draft_tokens = width
        self._use_verify_backend(width)

    def _use_verify_backend(self, width: int) -> None:
        """The target attention backend that verifies ``width`` tokens per request."""
        backends = getattr(self, "_verify_backends", None)
        if backends is None:
            runner = getattr(self, "model_runner", None)
            if runner is None or not hasattr(runner, "attn_backend"):
                return  # no target attention backend (a stand-in runner)
            # init_cuda_graphs was not called: the backend in place is the startup one.
            backends = self._verify_backends = VerifyWidthBackends(runner, self.max_width)
        backends.activate(width)

    def _verify_at_width(
        self, batch: Any, width: int, staged: tuple[Any, Any], on_publish, pp_proxy_tensors
    ) -> Any:
        """One decode step of the host's NGRAM verify at ``width`` with the drafts
        ``staged`` (tokens, mask in that width's layout), then back to the width the
        worker had; the relay padded back to that width. SUFFIX's width-1 steps with no
        draft and its ragged steps at the batch's longest draft."""
        back = self.draft_token_num
        self._use_width(width)
        try:
            self._staged = staged
            result = super().forward_batch_generation(  # type: ignore[misc]
                batch, on_publish, pp_proxy_tensors
            )
        finally:
            self._staged = None
            self._use_width(back)
        if result.next_draft_input is not None:
            self._pad_relay(result.next_draft_input, len(batch.reqs), width, to=back)
        return result

    def _pad_relay(self, draft_input: Any, bs: int, width: int, to: int | None = None) -> None:
        """Relayed accepted tokens at the startup stride (overlap scheduling), or at
        ``to`` (a step inside a step of that width: ragged verify under adaptive SUFFIX)."""
        to = self.max_width if to is None else to
        tokens = draft_input.accept_tokens
        if tokens is None:
            return
        if tokens.numel() != bs * width:
            raise RuntimeError(
                f"SUFFIX: relay of {tokens.numel()} accepted tokens for {bs} "
                f"requests at width {width}; expected {bs * width}"
            )
        padded = torch.zeros((bs, to), dtype=tokens.dtype, device=tokens.device)
        padded[:, :width] = tokens.view(bs, width)
        draft_input.accept_tokens = padded.flatten()
        draft_input.draft_token_num = to
