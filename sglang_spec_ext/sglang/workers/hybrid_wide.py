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
  torch_native), and on FA3 / FA4, which sizes it when built: there the worker builds one
  target backend per wide width at start-up (the host's factory, as adaptive SUFFIX
  does) and swaps it in for a wide step's verify (:meth:`WideStepsMixin._widen`); FA3's
  eager draft extend reads each request's extend length from the batch, so the draft
  side needs none. The verify and draft-extend CUDA graphs refuse a width they were not
  captured at, so a wide step runs both eagerly (the host's own fallback);
* exactness: the host verifies the wide input as any EAGLE tree (greedy or sampled);
  padding nodes (token 0, chained below a row's last node) are accepted only where the
  target itself predicts token 0;
* TP: every rank widens from the first rank's shared rows (``tp_sync``), so the width
  and rows agree.

Not wide (the suffix draft is cut to ``W_m - 1`` nodes as before, one start-up line
says why): another attention backend (trtllm_mha among them), FA3 where a backend per
wide width cannot be built, rejection sampling with draft probabilities
(``--speculative-use-rejection-sampling``), a draft that plans its KV window
(``kv_loc_plan``), pipeline parallelism, or a suffix width at or below ``W_m``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from sglang_spec_ext.hybrid.candidate import MODEL, SUFFIX, Candidate
from sglang_spec_ext.hybrid.wide import Explorer, TokenCost, WideStats, wide_pays
from sglang_spec_ext.sglang.verify.ragged import (
    RaggedForwardTarget,
    RaggedPlan,
    RaggedStats,
    compact_plan,
)
from sglang_spec_ext.sglang.verify.ragged_backends import FA3_BACKEND, RaggedRoute, ragged_route
from sglang_spec_ext.sglang.verify.wide_input import build_wide_input
from sglang_spec_ext.sglang.verify.widths import (
    VerifyWidthBackendError,
    VerifyWidthBackends,
    backend_name,
    reads_width_from_spec_info,
)
from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.verify.layout import full_parents_batch, masks_from_parents

logger = logging.getLogger("sglang_spec_ext")

#: Target attention backends whose verify applies the tree mask whenever the verify input's
#: ``tree_topk`` is not 1: the CPU engine's torch_native (cpu/fallbacks/verify_attention.py).
#: The host's GPU backends choose their chain kernels from the start-up topk, so under
#: ``--speculative-eagle-topk 1`` their suffix rows stay chains.
TREE_ROWS_BACKENDS = ("TorchNativeAttnBackend",)
#: The topk a step with suffix trees verifies under at start-up topk 1 (any value > 1: the
#: tree mask applies and the accepted path is moved to the front of each request's rows).
TREE_TOPK = 2


def wide_problem(worker: Any, suffix_width: int, model_width: int) -> str | None:
    """Why ``worker`` (a HYBRID worker) cannot verify wide steps (None: it can)."""
    if suffix_width <= model_width:
        return (
            f"SGLANG_SPEC_EXT_HYBRID_SUFFIX_WIDTH={suffix_width} is at or below the model's "
            f"verify width {model_width}"
        )
    backend = _target_backend(worker)
    if backend is None:
        return "the target's attention backend is not known when the worker starts"
    if not reads_width_from_spec_info(backend) and type(backend).__name__ != FA3_BACKEND:
        return (
            f"the target's {backend_name(backend)} sizes its verify metadata at start-up "
            "(use --attention-backend fa3, triton or flashinfer)"
        )
    from sglang.srt.runtime_context import get_parallel, get_spec

    if getattr(get_spec(), "speculative_use_rejection_sampling", False):
        return "--speculative-use-rejection-sampling verifies with the model's draft probabilities"
    if getattr(get_parallel(), "pp_size", 1) > 1:
        return "pipeline parallelism relays the model's chains between stages"
    return None


def _target_backend(worker: Any) -> Any:
    return getattr(getattr(worker.target_worker, "model_runner", None), "attn_backend", None)


def tree_rows_problem(worker: Any) -> str | None:
    """Why ``worker`` at ``--speculative-eagle-topk 1`` cannot verify suffix trees (None: it
    can, or its topk is > 1 and the host verifies trees anyway)."""
    if int(worker.topk) > 1:
        return None
    name = type(_target_backend(worker)).__name__
    if name in TREE_ROWS_BACKENDS:
        return None
    return f"the target's {name} verifies chains at --speculative-eagle-topk 1"


class PackedRows:
    """One step's rows, packed ``width`` wide: tokens (root first), ancestor masks, node
    counts, and which rows hold the suffix draft. The masks are built for all rows at
    once when first read (``verify/layout.masks_from_parents``)."""

    def __init__(self, bs: int, width: int) -> None:
        self.width = width
        self.flags = np.zeros(bs, dtype=np.int64)
        self.lens = np.zeros(bs, dtype=np.int64)
        self.tokens = np.zeros((bs, width), dtype=np.int64)
        self._parents: list[Any] = [()] * bs
        self._masks: np.ndarray | None = None

    def write(self, b: int, tokens: Any, parents: Any) -> None:
        n = len(tokens)
        self.tokens[b, 1:] = 0
        self.tokens[b, 1 : 1 + n] = tokens
        self._parents[b] = parents
        self.lens[b] = n
        self._masks = None

    @property
    def masks(self) -> np.ndarray:
        """bool [bs, W, W]: each row's ancestor mask (``verify/layout.tree_mask``)."""
        if self._masks is None:
            self._masks = masks_from_parents(full_parents_batch(self._parents, self.width))
        return self._masks


class WideStepsMixin:
    """Wide steps for :class:`~.hybrid_worker.HybridMixin` (see the module doc)."""

    speculative_num_draft_tokens: int

    def _init_wide(self, suffix_width: int, cost_prior: float) -> None:
        self._wide_width = suffix_width  # 0 once wide steps turn out impossible
        self._wide_resolved = False
        self._suffix_trees = int(self.topk) > 1  # suffix drafts as trees (_resolve_wide)
        self._tree_step = False  # this step verifies suffix trees at start-up topk 1
        self._wide_blocked = False  # this step's verify input cannot be rebuilt (block_wide)
        #: How wide steps' rows reach the target at their own lengths (None: padded).
        self._ragged_route: RaggedRoute | None = None
        self._ragged_plan: RaggedPlan | None = None  # this step's compact target forward
        self._ragged_stats = RaggedStats()
        self._wide_cost = TokenCost(cost_prior)
        self._explorer = Explorer()
        self._wide_stats = WideStats()
        #: The widths (worker, draft worker) and target backend a wide step replaced.
        self._narrowed: tuple[int, int, Any] | None = None
        #: FA3's target backends per wide width (None: the startup one reads any width).
        self._wide_backends: VerifyWidthBackends | None = None
        self._step_width = int(self.speculative_num_draft_tokens)
        self._timed: tuple[int, float, int] | None = None  # (bs, start, verify tokens)

    def _pack_width(self) -> int:
        """Columns of this step's packed rows: the suffix width where wide steps can run."""
        return max(int(self.speculative_num_draft_tokens), self._wide_width)

    def _resolve_wide(self) -> None:
        """At start-up, once the host built the attention backends (or at the first decode
        step): wide steps or why not, suffix trees at topk 1 or why not, one line each."""
        if self._wide_resolved:
            return
        self._wide_resolved = True
        model = int(self.speculative_num_draft_tokens)
        problem = wide_problem(self, self._wide_width, model) or self._prepare_backends(model)
        if problem is not None:
            self._wide_width = 0
            logger.info("HYBRID: suffix drafts cut to the model's verify width %d: %s", model,
                        problem)  # fmt: skip
        else:
            logger.info("HYBRID: a winning suffix draft keeps up to %d tokens (wide steps verify "
                        "at up to width %d where the extra tokens pay; eager verify and draft "
                        "extend there)", self._wide_width - 1, self._wide_width)  # fmt: skip
        from sglang_spec_ext.sglang.serving.server_args import plugin_config

        if not plugin_config().use_tree:
            self._suffix_trees = False
            logger.info("HYBRID: suffix drafts are chains (SGLANG_SPEC_EXT_USE_TREE=0)")
        elif not self._suffix_trees:
            problem = tree_rows_problem(self)
            self._suffix_trees = problem is None
            logger.info("HYBRID: suffix drafts are %s at --speculative-eagle-topk 1%s",
                        "trees" if problem is None else "chains",
                        "" if problem is None else f": {problem}")  # fmt: skip
        if self._wide_width:
            self._resolve_ragged()
        self._suffix = self._suffix_drafter()

    def _prepare_backends(self, model: int) -> str | None:
        """Where the target's backend sizes its verify metadata when built (FA3 / FA4), one
        backend per wide width, built now (not inside a decode step); why not (None: built,
        or not needed)."""
        runner = self._target_worker.model_runner
        if reads_width_from_spec_info(runner.attn_backend):
            return None
        backends = VerifyWidthBackends(runner, model, label="HYBRID")
        try:
            backends.prepare(range(model + 1, self._wide_width + 1))
        except VerifyWidthBackendError as exc:
            cause = exc.__cause__ or exc
            return (f"the target's {type(runner.attn_backend).__name__} could not be built "
                    f"per wide width ({type(cause).__name__}: {cause})")  # fmt: skip
        self._wide_backends = backends
        return None

    def _resolve_ragged(self) -> None:
        from sglang_spec_ext.sglang.serving.server_args import plugin_config
        from sglang_spec_ext.sglang.workers.suffix_ragged import _lora_problem

        problem = None if plugin_config().ragged_verify else "SGLANG_SPEC_EXT_RAGGED_VERIFY=0"
        route = None
        if problem is None:
            # Every row a chain: topk 1 and suffix drafts as chains (tree_rows_problem).
            chains = int(self.topk) <= 1 and not self._suffix_trees
            route, problem = ragged_route(self.target_worker.model_runner, chains)
        problem = problem or _lora_problem(self)
        self._ragged_route = route if problem is None else None
        logger.info("HYBRID: wide steps verify %s", f"each row at its own length (ragged: "
                    f"{route.describe()})" if problem is None
                    else f"padded to their width: {problem}")  # fmt: skip

    @property
    def target_worker(self) -> Any:
        """The target worker; during a ragged wide step's verify, its compact-forward
        wrapper (``verify/ragged.py``)."""
        plan = getattr(self, "_ragged_plan", None)  # also read by the host's __init__
        if plan is None:
            return self._target_worker
        return RaggedForwardTarget(self._target_worker, plan, self._ragged_route)

    def _plan_ragged(self, vi: Any, lens: np.ndarray, width: int) -> None:
        """A wide step's rows at their own length (``lens``: nodes, root excluded)."""
        lens = np.minimum(np.asarray(lens, dtype=np.int64) + 1, width)
        ragged = self._ragged_route is not None and bool((lens < width).any())
        self._ragged_stats.count(lens, width, ragged, width)
        if ragged:
            self._ragged_plan = compact_plan(vi, lens, width)
            self._ragged_stats.host_layout_steps += self._ragged_route.host_layout

    def init_attention_backends(self) -> None:
        super().init_attention_backends()  # type: ignore[misc]
        self._resolve_wide()

    def _block_wide(self, vi: Any) -> None:
        """A verify input that carries what a rebuilt one would lose (the draft's planned
        KV window, draft probabilities for rejection sampling) keeps this step narrow."""
        self._wide_blocked = (getattr(vi, "kv_loc_plan", None) is not None
                              or getattr(vi, "draft_probs", None) is not None)  # fmt: skip

    def _mark_tree_step(self, vi: Any, rows: list[int]) -> None:
        """A step with suffix rows at start-up topk 1 where they are trees: the verify input
        says so (the tree mask applies) and the verify moves the accepted path to the front
        (:meth:`verify_topk`)."""
        self._tree_step = bool(rows) and self._suffix_trees and int(self.topk) == 1
        if self._tree_step:
            vi.topk = TREE_TOPK

    def verify_topk(self) -> int:
        """The topk this step's verify runs under (see :meth:`_mark_tree_step`)."""
        return TREE_TOPK if self._tree_step else int(self.topk)

    def _time_step(self, batch: Any) -> None:
        """The previous decode step's wall time (to this step's start, same batch size)."""
        prev, self._timed = self._timed, None
        if prev is None or not batch.forward_mode.is_decode():
            return
        bs, start, tokens = prev
        if bs == len(batch.reqs):
            self._wide_cost.on_step(bs, tokens, time.perf_counter() - start)

    def _widen(self, batch: Any, vi: Any, tokens: np.ndarray, masks: np.ndarray) -> Any:
        """The step's verify input at the width of ``tokens``; the worker and its draft
        worker at that width until :meth:`_narrow_back`."""
        wide = build_wide_input(vi, batch, tokens, masks, int(self._mask_mode()))
        draft, runner = self._draft_worker, self._target_worker.model_runner
        width = tokens.shape[1]
        backend = None if self._wide_backends is None else self._wide_backends.backend(width)
        self._narrowed = (int(self.speculative_num_draft_tokens),
                          int(draft.speculative_num_draft_tokens),
                          runner.attn_backend if backend is not None else None)  # fmt: skip
        self.speculative_num_draft_tokens = width
        draft.speculative_num_draft_tokens = width
        if backend is not None:  # FA3: the target verifies on the backend of this width
            runner.attn_backend = backend
        return wide

    def _narrow_back(self) -> None:
        narrowed, self._narrowed = self._narrowed, None
        if narrowed is not None:
            self.speculative_num_draft_tokens = narrowed[0]
            self._draft_worker.speculative_num_draft_tokens = narrowed[1]
            if narrowed[2] is not None:  # the backend it had (the host may swap its own)
                self._target_worker.model_runner.attn_backend = narrowed[2]

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        decode = not (batch.forward_mode.is_extend() or batch.is_extend_in_batch)
        self._tree_step = False
        self._ragged_plan = None
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

    def _fit_width(
        self, packed: PackedRows, trees: list[DraftTree | None], models: list[Candidate | None]
    ) -> None:
        """Where a winning suffix draft (chosen on its cut to the model's width) is longer
        than that width: keep it whole (a wide step) where the expected extra accepted
        tokens pay for the step's extra verify tokens (``hybrid/wide.py``), else cut it."""
        width = self._width
        long = [b for b in range(len(trees)) if packed.flags[b] and packed.lens[b] > width - 1]
        if not long:
            return
        est = self.hybrid.estimator
        bs = len(trees)
        committed, gain, cut = float(bs), 0.0, {}
        for b in range(bs):
            model, tree = models[b], trees[b]
            if not packed.flags[b]:
                committed += est.expected(MODEL, model.score) if model and model.tokens else 0.0
            elif b not in long:
                committed += est.expected(SUFFIX, tree.score)
            else:
                cut[b] = short = tree.first(width - 1)
                narrow = est.expected(SUFFIX, short.score)
                committed += narrow
                gain += max(0.0, est.expected(SUFFIX, tree.score) - narrow)
        stats = self._wide_stats
        stats.steps += 1
        wide = 1 + int(packed.lens[long].max())
        if self._wide_blocked:  # this step's verify input cannot be rebuilt wider
            chosen = False
        else:
            pays = wide_pays(self._wide_cost, bs, width, wide, committed, gain)
            chosen = self._explorer.choose(bs, pays)
            stats.explored += chosen != pays
        if chosen:
            stats.wide_steps += 1
            stats.wide_rows += len(long)
            return
        stats.capped_rows += len(long)
        for b, short in cut.items():
            packed.write(b, short.tokens, short.parents)

    def wide_stats(self) -> dict[str, Any]:
        ragged = {f"wide_{k}": v for k, v in self._ragged_stats.as_dict().items()}
        return {"suffix_width": self._wide_width, **self._wide_stats.as_dict(),
                **self._wide_cost.stats(), **ragged}  # fmt: skip
