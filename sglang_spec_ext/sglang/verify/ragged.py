"""Ragged verify: each request's target forward covers its own draft, not the batch's widest.

The host's NGRAM verify path (which SUFFIX and adaptive SUFFIX run on) verifies every
request at one width ``W``: a request with a 2-token draft and one with none both put
``W`` tokens through the target, the rest padding. With ragged verify the target
forward runs on each request's root and draft nodes only (``L_i = 1 + n_i`` tokens,
``sum L_i`` in all), and everything around the forward keeps the host's padded
``[bs, W]`` layout: the verify input (tokens, tree mask, links, KV slots), the greedy
and sampling verify, the KV moves, the overlap relay. What changes, per verify step:

* :meth:`RaggedVerify.plan` (after the host built the verify input): the padding nodes
  are cut off the tree (the first-child link of each padded request's last real node is
  set to -1), so no verifier can reach a node the target did not see. Padding nodes
  were reachable before (token 0 chained below the last node): a target that predicts
  token 0 there accepted one, a token it did predict, so output was exact then and is
  exact now; only the padded row's own prediction is no longer computed.
* :class:`RaggedTarget` (the target worker during the verify forward): the batch's
  input ids, KV slots and the verify input's positions are swapped for the compact ones
  (``sum L_i`` rows, in request order), the verify input carries the lengths where
  the attention backend reads them (``ragged_backends.py``: the plugin's tree verify
  reads ``ragged_lens_cpu``, FA3 / trtllm_mha read the host's ``RaggedVerifyLayout``),
  and after the forward the logits are scattered back to ``[bs * W, vocab]`` rows
  (padding rows zero: unreachable) and every swapped field restored, so the host's
  verify reads the layout it built.

Which attention backend can run a ragged target verify, and for which drafts
(``ragged_backends.py``): the CPU engine's ``torch_native`` with the plugin's verify
attention, the host's triton (its verify metadata cut to the lengths,
``triton_ragged.py``) and flashinfer (the verify input's prefill plan cut to them,
``flashinfer_ragged.py``), trees and chains; FA3 with trees (its two-pass tree-verify
metadata cut, ``fa3_ragged.py``); the host's FA3 and trtllm_mha through the host's own
layout, causal, so chain drafts only (``SGLANG_SPEC_EXT_USE_TREE=0``). Under CUDA graphs
the target's verify graphs are keyed by total verify tokens where the backend has a ragged
verify in graphs (``ragged_graphs.py``): the compact forward is padded to its token bucket
and carries the host's layout; elsewhere a ragged step runs the target forward eagerly
(graphs captured for ``bs * W`` tokens).

No host sync: the lengths are host values (the drafts are built on the host), the
indices are copied to the device once per step, non-blocking.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sglang_spec_ext.sglang.verify.padded_rows import PaddedRows
from sglang_spec_ext.sglang.verify.ragged_backends import (
    TREE_ROUTE_BACKENDS,
    RaggedRoute,
    carry_lens,
    drop_lens,
    to_device,
)
from sglang_spec_ext.sglang.verify.ragged_graphs import bucket_layout
from sglang_spec_ext.verify.layout import kept_rows

logger = logging.getLogger("sglang_spec_ext")


@dataclass
class RaggedStats:
    """Verify tokens per step with and without the padding (the stats line's figures)."""

    steps: int = 0
    ragged_steps: int = 0
    verified_tokens: int = 0  # tokens through the target forward
    padded_tokens: int = 0  # what the padded verify would have put through
    bucket_steps: int = 0  # verify forwards laid out for a token-bucket graph
    bucket_tokens: int = 0  # their buckets' tokens (verified plus the bucket's padding)
    host_layout_steps: int = 0  # verify forwards handed the host's RaggedVerifyLayout
    graph_kept_steps: int = 0  # padded to replay a verify graph, not run ragged eagerly

    def count(self, lens: np.ndarray, width: int, ragged: bool, padded_width: int) -> None:
        self.steps += 1
        self.padded_tokens += len(lens) * padded_width
        if ragged:
            self.ragged_steps += 1
            self.verified_tokens += int(lens.sum())
        else:
            self.verified_tokens += len(lens) * width

    def as_dict(self) -> dict[str, Any]:
        steps = max(self.steps, 1)
        return {
            "ragged_verify_steps": self.ragged_steps,
            "verify_steps": self.steps,
            "verify_tokens_per_step": round(self.verified_tokens / steps, 3),
            "padded_verify_tokens_per_step": round(self.padded_tokens / steps, 3),
            "bucket_verify_steps": self.bucket_steps,
            "bucket_tokens_per_step": round(self.bucket_tokens / max(self.bucket_steps, 1), 3),
            "host_layout_verify_steps": self.host_layout_steps,
            "graph_kept_verify_steps": self.graph_kept_steps,
        }


@dataclass
class RaggedPlan:
    """One step's compaction: which of the ``bs * W`` verify rows the target computes."""

    lens: list[int]
    width: int
    keep: torch.Tensor  # [sum L] int64 indices into the bs * W rows


class RaggedVerify:
    """Per-worker ragged verify (see the module doc). ``lens`` of the step being verified
    are set by the worker's draft source (:meth:`set_lens`), the same on every TP rank."""

    def __init__(self, route: RaggedRoute | None = None) -> None:
        #: How the target's attention backend reads the lengths (``ragged_backends.py``),
        #: set once the backends exist.
        self.route = route or RaggedRoute(TREE_ROUTE_BACKENDS[0], host_layout=False)
        self.stats = RaggedStats()
        self._lens: np.ndarray | None = None
        self.plan_now: RaggedPlan | None = None
        #: The width a padded verify of this step would have had, where the worker
        #: verifies it narrower (at its longest draft): what the stats compare with.
        self.padded_width: int | None = None
        #: On a GPU without token-bucket graphs: batches up to this size verify padded, so
        #: their verify graph replays (a ragged step would run eagerly); None: no limit.
        self.graph_bs_limit: int | None = None

    def keeps_graph(self, bs: int) -> bool:
        """Whether a step of ``bs`` requests verifies padded so its verify graph replays
        (``graph_bs_limit``: a GPU without token-bucket graphs, ``RAGGED_EAGER=auto``)."""
        return self.graph_bs_limit is not None and bs <= self.graph_bs_limit

    def set_lens(self, lens: np.ndarray | None) -> None:
        """This step's verify lengths (root included, 1..W per request) or None."""
        self._lens = None if lens is None else np.asarray(lens, dtype=np.int64)

    def pending_lens(self, bs: int, width: int) -> np.ndarray:
        """The lengths set for the coming step (all ``width`` where none are set)."""
        if self._lens is None or len(self._lens) != bs:
            return np.full(bs, width, dtype=np.int64)
        return self._lens

    def plan(self, batch: Any, width: int, always: bool = False) -> None:
        """After the host built the verify input of ``batch``: cut the padding off the
        tree and plan the compact forward (nothing where no request is padded, unless
        ``always``: the target's graphs are token-bucket graphs, which replay only a
        verify that carries its layout, ``verify/ragged_graphs.py``)."""
        lens, self._lens = self._lens, None
        self.plan_now = None
        if lens is None or not batch.forward_mode.is_target_verify():
            return
        bs = len(batch.reqs)
        if len(lens) != bs or bs == 0:
            return
        if lens.min() < 1 or lens.max() > width:
            raise ValueError(f"ragged verify lengths {lens.tolist()} outside 1..{width}")
        ragged = bool((lens < width).any())
        if ragged and self.keeps_graph(bs):
            ragged = False  # the padded verify replays a graph; the ragged one would not
            self.stats.graph_kept_steps += 1
        self.stats.count(lens, width, ragged, self.padded_width or width)
        if ragged or always:
            self.plan_now = compact_plan(batch.spec_info, lens, width)

    def target(self, target_worker: Any) -> Any:
        """The target worker for this step's verify forward (compact where planned)."""
        if self.plan_now is None:
            return target_worker
        return RaggedTarget(target_worker, self)

    def stats_dict(self) -> dict[str, Any]:
        return self.stats.as_dict()


def compact_plan(spec_info: Any, lens: np.ndarray, width: int) -> RaggedPlan:
    """The compact forward of a verify input ``width`` wide whose request ``b`` holds
    ``lens[b]`` real nodes (root included), padding after them: the padding cut off each
    tree (the first-child link of each padded request's last real node: padding hangs
    only below it, ``verify/layout.py``) and the rows the forward keeps."""
    device = spec_info.retrieve_next_token.device
    rows = np.nonzero(lens < width)[0]
    last = rows * width + lens[rows] - 1  # each padded request's last real node
    # both index arrays in one copy (pinned on a GPU: ragged_backends.to_device)
    dev = to_device(torch.from_numpy(np.concatenate([last, kept_rows(lens, width)])), device)
    spec_info.retrieve_next_token.view(-1)[dev[: last.size]] = -1
    return RaggedPlan(lens=lens.tolist(), width=width, keep=dev[last.size :])


class RaggedTarget:
    """The target worker during one ragged verify forward: compact in, padded out."""

    def __init__(self, worker: Any, ragged: RaggedVerify) -> None:
        self._worker = worker
        self._ragged = ragged

    def __getattr__(self, name: str) -> Any:
        return getattr(self._worker, name)

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        plan, self._ragged.plan_now = self._ragged.plan_now, None
        if plan is None or not kwargs.get("is_verify"):
            return self._worker.forward_batch_generation(batch, *args, **kwargs)
        spec_info = batch.spec_info
        saved = (batch.input_ids, batch.out_cache_loc, spec_info.positions)
        keep = plan.keep
        compact = [t.view(-1)[keep] for t in saved]
        layout = bucket_layout(self._worker, plan.lens, keep.device)
        if layout is not None:  # a token-bucket graph replays it: pad to the bucket
            compact = [_pad_rows(t, layout.graph_num_tokens) for t in compact]
            spec_info.ragged_verify_layout = layout
            self._ragged.stats.bucket_steps += 1
            self._ragged.stats.bucket_tokens += layout.graph_num_tokens
        batch.input_ids, batch.out_cache_loc, spec_info.positions = compact
        carry_lens(spec_info, plan.lens, self._ragged.route, keep.device,
                   getattr(batch, "seq_lens_cpu", None))  # fmt: skip
        self._ragged.stats.host_layout_steps += self._ragged.route.host_layout
        try:
            result = self._worker.forward_batch_generation(batch, *args, **kwargs)
        finally:
            batch.input_ids, batch.out_cache_loc, spec_info.positions = saved
            drop_lens(spec_info)
        return _padded(result, plan)


class RaggedForwardTarget:
    """The target worker during one ragged verify forward whose forward batch is built
    before the call (the host's EAGLE verify, which HYBRID's wide steps run): the batch's
    input ids, positions and KV slots compacted, logits scattered back to padded rows."""

    def __init__(self, worker: Any, plan: RaggedPlan, route: RaggedRoute) -> None:
        self._worker = worker
        self._plan: RaggedPlan | None = plan
        self._route = route

    def __getattr__(self, name: str) -> Any:
        return getattr(self._worker, name)

    def forward_batch_generation(self, *args: Any, **kwargs: Any) -> Any:
        plan, self._plan = self._plan, None
        fb = kwargs.get("forward_batch")
        if plan is None or fb is None or not kwargs.get("is_verify"):
            return self._worker.forward_batch_generation(*args, **kwargs)
        spec_info = fb.spec_info
        saved = (fb.input_ids, fb.positions, fb.out_cache_loc, spec_info.positions)
        keep = plan.keep
        fb.input_ids, fb.positions, fb.out_cache_loc, spec_info.positions = (
            t.view(-1)[keep] for t in saved
        )
        carry_lens(
            spec_info, plan.lens, self._route, keep.device, getattr(fb, "seq_lens_cpu", None)
        )
        try:
            result = self._worker.forward_batch_generation(*args, **kwargs)
        finally:
            fb.input_ids, fb.positions, fb.out_cache_loc, spec_info.positions = saved
            drop_lens(spec_info)
        return _padded(result, plan)


#: The padded rows handed back to the host's verify (persistent buffers on a CPU).
PADDED_ROWS = PaddedRows()


def _padded(result: Any, plan: RaggedPlan) -> Any:
    """``result`` of a compact forward with its logits (and hidden states) scattered back
    to the ``bs * W`` padded rows (padding rows zero: unreachable)."""
    out = result.logits_output
    rows = len(plan.lens) * plan.width
    out.next_token_logits = PADDED_ROWS.scatter(out.next_token_logits, plan.keep, rows)
    if getattr(out, "hidden_states", None) is not None:
        out.hidden_states = PADDED_ROWS.scatter(out.hidden_states, plan.keep, rows, reuse=False)
    return result


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` (1-D) padded with zeros to ``rows`` entries (token 0, position 0, KV slot 0:
    the pool's reserved padding slot)."""
    return torch.cat([t, t.new_zeros(rows - t.numel())]) if rows > t.numel() else t


def draft_lens(node_counts: list[int] | np.ndarray, width: int) -> np.ndarray:
    """Verify lengths (root included) for draft trees of ``node_counts`` nodes."""
    lens = np.asarray(node_counts, dtype=np.int64) + 1
    if lens.size and (lens > width).any():
        raise ValueError(f"draft of {int(lens.max()) - 1} nodes exceeds verify width {width}")
    return lens
