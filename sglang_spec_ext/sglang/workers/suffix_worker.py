"""The SUFFIX speculative worker: the host's NGRAM worker with our drafter.

Everything after drafting is the host's own NGRAM path (verify input, tree
mask, CUDA graphs, greedy and sampling verify, KV moves, metrics, overlap
relay). This class replaces only the draft source: each decode step
(:meth:`SuffixWorker._prepare_draft_tokens`, the host's hook) syncs every request of
the batch to its drafter session with the tokens it committed and drafts for it.
The parts, one module each:

* ``suffix_sessions.py``: the drafter's request sessions (sync of committed tokens,
  close, drafting faults, rebuild, the stats line), shared with HYBRID;
* ``suffix_relay.py``: the tokens a request committed that ``req.output_ids`` lacks
  yet under overlap scheduling (spliced in exactly as the host's NGRAM does);
* ``suffix_corpora.py``: the host's external-corpus requests;
* ``suffix_ragged.py``: ragged verify (each request's own draft through the target,
  ``verify/ragged.py``), the step at the batch's longest draft;
* this module: the worker's construction, its step (a plain or width-1 verify step
  where no request has a draft, ``plain_step.py``; the draft gate's timing) and the
  draft source: drafts packed in the host's verify layout, the same on every TP rank.

Drafter faults never stop serving: the affected requests get an empty draft for
that step (plain decoding through the verify path: the output stays the target's)
and their sessions restart (``suffix_sessions.py``); a malformed draft is found and
only its request plain-decodes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np
import torch
from sglang.srt.runtime_context import get_device, get_schedule, get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.ngram_worker import NGRAMWorker

from sglang_spec_ext.sglang.model_drafts.step_prior import served_roofline
from sglang_spec_ext.sglang.serving.external_corpus import CorpusStore
from sglang_spec_ext.sglang.serving.request_options import cap_tree, max_draft_tokens
from sglang_spec_ext.sglang.serving.server_args import plugin_config
from sglang_spec_ext.sglang.verify.ragged import RaggedVerify
from sglang_spec_ext.sglang.verify.width_switch import WidthSwitchMixin
from sglang_spec_ext.sglang.verify.widths import VerifyWidthBackends
from sglang_spec_ext.sglang.workers import plain_step
from sglang_spec_ext.sglang.workers.dp_tokens import DpTokenCounts, dp_token_counts
from sglang_spec_ext.sglang.workers.suffix_corpora import ExternalCorporaMixin
from sglang_spec_ext.sglang.workers.suffix_grammar import GrammarDrafts, served_tokenizer_path
from sglang_spec_ext.sglang.workers.suffix_ragged import RaggedStepsMixin
from sglang_spec_ext.sglang.workers.suffix_ranks import RanksMixin
from sglang_spec_ext.sglang.workers.suffix_relay import last_token, relayed_per_request
from sglang_spec_ext.sglang.workers.suffix_sessions import DrafterSessionsMixin, SessionCloser
from sglang_spec_ext.sglang.workers.suffix_sources import DraftSourcesMixin
from sglang_spec_ext.sglang.workers.tp_sync import TpSync, tp_sync
from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter
from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.suffix.gate import DraftGate, GateConfig
from sglang_spec_ext.verify.layout import pack_batch

logger = logging.getLogger("sglang_spec_ext")


def suffix_config_from_plugin_config() -> SuffixConfig:
    return plugin_config().suffix_config()


class SuffixWorker(
    RanksMixin,
    RaggedStepsMixin,
    DraftSourcesMixin,
    DrafterSessionsMixin,
    ExternalCorporaMixin,
    WidthSwitchMixin,
    NGRAMWorker,
):
    """``--speculative-algorithm SUFFIX`` (see the module doc)."""

    #: Capture width-1 target verify graphs at start-up for steps with no draft
    #: (adaptive SUFFIX captures every width of its ladder itself).
    NARROW_EMPTY_STEPS = True
    #: Gate each step on the drafts' calibrated worth (suffix/gate.py) when the config
    #: turns it on (adaptive SUFFIX does not: its controller chooses the width).
    USES_DRAFT_GATE = True

    def __init__(
        self,
        server_args: Any,
        gpu_id: int,
        nccl_port: int,
        target_worker: Any,
    ) -> None:
        # Not NGRAMWorker.__init__: it JIT-builds the host's C++ n-gram corpus,
        # which this worker never uses. The attributes below are the ones the
        # inherited NGRAM methods read (tests/host/test_suffix_worker.py checks
        # them against the host's NGRAMWorker.__init__).
        BaseSpecWorker.__init__(self)
        spec = get_spec()
        self.server_args = server_args
        self.enable_overlap = not get_schedule().disable_overlap_schedule
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.page_size = get_schedule().page_size
        self.draft_token_num = spec.speculative_num_draft_tokens
        self.speculative_num_draft_tokens = spec.speculative_num_draft_tokens
        self.max_trie_depth = spec.speculative_ngram_max_trie_depth
        self.topk = spec.speculative_eagle_topk
        self.speculative_num_steps = spec.speculative_num_steps
        self.device = get_device().device
        self.adaptive_controller = None
        self._prev_decode_rids: set = set()
        self.grammar_tree_host = None
        self._init_drafter()
        self._tp_sync = tp_sync()
        self._dp_tokens = dp_token_counts()
        self._init_ragged()
        logger.info(
            "SUFFIX worker: verify width %d, drafter backend %s, overlap %s",
            self.draft_token_num,
            self.drafter.backend,
            self.enable_overlap,
        )

    @classmethod
    def drafting_only(
        cls, use_tree: bool | None = None, tokenizer_path: str | None = None
    ) -> SuffixWorker:
        """The drafter and its request sessions without the host worker: what HYBRID
        (``hybrid_worker.py``) composes. ``use_tree=False`` drafts chains;
        ``tokenizer_path``: the served model's tokenizer, for grammar drafts' forced strings."""
        worker = object.__new__(cls)
        worker.enable_overlap = False
        worker._init_drafter(use_tree)
        worker._grammar.tokenizer_path = tokenizer_path
        worker._gate = None  # HYBRID chooses per request; it has its own calibration
        worker._recycler = None  # no verify logits reach it there (not yet)
        return worker

    def _init_drafter(self, use_tree: bool | None = None) -> None:
        """The drafter and its per-request sessions (no host runtime context needed)."""
        config = plugin_config()
        suffix_config = suffix_config_from_plugin_config()
        if use_tree is not None and use_tree != suffix_config.use_tree:
            suffix_config = dataclasses.replace(suffix_config, use_tree=use_tree)
        self.drafter = SuffixDrafter(suffix_config, backend=config.backend)
        self.max_width = getattr(self, "draft_token_num", 0)  # the startup verify width
        self._width_buffers: dict[int, dict[str, Any]] = {}
        self._verify_backends: VerifyWidthBackends | None = None
        self._narrow = False  # width-1 verify graphs for steps with no draft
        if self.drafter.backend != "native" and config.backend == "auto":
            logger.warning(
                "SUFFIX: the native suffix-tree core (sglang_spec_ext.suffix._native) is not "
                "built, so drafting falls back to the pure-Python drafter, 25-50x slower per "
                "step. Fix: install a C++17 compiler and pybind11, then reinstall with "
                "`pip install --no-build-isolation -e .` (SGLANG_SPEC_EXT_NO_NATIVE unset); "
                "`sglang-spec-ext doctor` checks it. Set SGLANG_SPEC_EXT_BACKEND=python to "
                "choose the Python drafter knowingly and silence this warning."
            )
        self.ngram_corpus = SessionCloser(self)  # where the host's NGRAM keeps its corpus
        self._tp_sync: TpSync | None = None  # set by __init__ with TP > 1
        self._dp_tokens: DpTokenCounts | None = None  # set by __init__ under DP attention
        self._plain_steps = config.plain_steps  # empty steps as plain decode steps
        self._step_empty = False  # no request has a draft in the last drafted step
        # The draft gate (suffix/gate.py): fixed-width SUFFIX verifies only where it pays.
        self._gate = (
            DraftGate(
                GateConfig(
                    cost_prior=config.draft_gate_cost,
                    realised_scale=config.draft_gate_realised,
                )
            )
            if (self.USES_DRAFT_GATE and config.draft_gate and config.plain_steps)
            else None
        )
        if self._gate is not None:  # ragged lengths' cost prior: the served model's roofline
            self._gate.roofline = served_roofline(getattr(self, "model_runner", None))
        # (bs, verified, start, draft nodes verified) of the last decode step
        self._gate_step: tuple[int, bool, float, int] | None = None
        self._step_drafts = 0
        self._staged: tuple[np.ndarray, np.ndarray] | None = None
        self._ragged: RaggedVerify | None = None  # set by __init__ (_init_ragged)
        self._ragged_resolved = False
        self._shorter_steps = True  # ragged steps at their longest draft (suffix_ragged.py)
        self._config = config  # the bounds the metrics report
        # grammar-aware drafts for structured-output requests (suffix_grammar.py)
        tokenizer_path = served_tokenizer_path(getattr(self, "server_args", None))
        self._grammar = GrammarDrafts(
            config.grammar_drafts, config.grammar_draft_ms, tokenizer_path
        )
        self.corpora = CorpusStore(self, config.max_corpus_tokens)
        self._init_recycle(config)  # the target's top-k beside the trees (suffix_sources.py)
        self._init_sessions(config)  # suffix_sessions.py (and a snapshot's warm restart)

    # -- the step: the host's NGRAM step, or a plain one where nothing was drafted ---
    def forward_batch_generation(
        self, batch: Any, on_publish=None, pp_proxy_tensors=None, *, grammar_barrier=None
    ):
        """:meth:`_step`, then the top-k of a decode step's logits launched for the
        recycled draft source (``suffix_sources.py``; no wait)."""
        decode = batch.forward_mode.is_decode() and bool(batch.reqs)
        result = self._step(batch, on_publish, pp_proxy_tensors, grammar_barrier=grammar_barrier)
        if decode and self._recycler is not None:
            self._recycle_tap(batch, result)
        return result

    def _step(self, batch: Any, on_publish=None, pp_proxy_tensors=None, *, grammar_barrier=None):
        """The host's NGRAM step, or a plain decode step where no request of the batch
        has a draft (``plain_step.py``; the emptiness is the verified drafts', the same
        on every TP rank).

        ``grammar_barrier`` (grammar batches under overlap scheduling, where our spec class
        says ``supports_grammar_overlap``): advances each request's grammar FSM over the
        previous step's tokens; called before drafting, since grammar-aware drafts start
        from that state and the host's verify mask needs it too."""
        self._staged = None
        if grammar_barrier is not None and batch.has_grammar and batch.forward_mode.is_decode():
            grammar_barrier()
            self._grammar.barrier_steps += 1
        if self._gate is not None:
            self._time_gate_step(batch)
        if self._plain_steps and batch.forward_mode.is_decode() and batch.reqs:
            tokens, mask = self._prepare_draft_tokens(batch)
            if self._gate is not None:
                self._gate_step = (len(batch.reqs), not self._step_empty, time.perf_counter(),
                                   self._step_drafts)  # fmt: skip
            if self._step_empty:
                reason = plain_step.ineligible(batch, pp_proxy_tensors)
                if reason is None:
                    roots = torch.from_numpy(tokens[:: self.draft_token_num])
                    if self._narrow_fits(batch):
                        return self._narrow_step(batch, roots, on_publish, pp_proxy_tensors)
                    result = plain_step.ngram_plain_step(self, batch, roots, on_publish)
                    if result is not None:
                        return result
                else:
                    plain_step.STATS.count(False, reason)
            self._staged = (tokens, mask)
            if self._ragged is not None:
                longest = int(
                    self._ragged.pending_lens(len(batch.reqs), self.draft_token_num).max()
                )
                if 1 < longest < self.draft_token_num and self._shorter_fits(
                    len(batch.reqs), longest
                ):
                    return self._shorter_step(batch, longest, on_publish, pp_proxy_tensors)
        self._exchange_dp_tokens(batch)  # DP attention (plain, narrow, ragged steps off)
        return super().forward_batch_generation(batch, on_publish, pp_proxy_tensors)

    def init_cuda_graphs(self) -> None:
        """After the target's graphs (the scheduler's order): where the startup width has
        verify graphs, width-1 verify graphs too, on which a step with no draft for any
        request replays a decode-shaped forward (:meth:`_narrow_step`). Without them such
        a step runs the plain decode forward eagerly: the host's verify graph runner
        refuses a DECODE batch of an NGRAM-style worker (its width check), and eager
        kernel launches cost more than a replay on a GPU at small batch sizes."""
        super().init_cuda_graphs()
        self._resolve_ragged()
        self._prepare_shorter_widths()
        if not (self.NARROW_EMPTY_STEPS and self._plain_steps and self.max_width > 1):
            return
        if getattr(self.model_runner, "decode_cuda_graph_runner", None) is None:
            return  # eager serving: such steps run as plain decode steps
        backends = self._verify_backends or VerifyWidthBackends(self.model_runner, self.max_width)
        try:
            backends.prepare_graphs((1,))
        except Exception as exc:  # an optimisation: serve without it, say so
            logger.warning(
                "SUFFIX: could not capture width-1 verify graphs (%s); steps with no draft "
                "run the plain decode forward eagerly (the width-%d verify graphs refuse a "
                "decode batch). SGLANG_SPEC_EXT_PLAIN_STEPS=0 silences this.",
                exc,
                self.max_width,
            )
            return
        self._verify_backends = backends
        self._narrow = True

    def _narrow_fits(self, batch: Any) -> bool:
        """Whether this step replays the width-1 verify graphs (captured, batch size
        within the captured sizes, the worker at its startup width)."""
        if not self._narrow or self.draft_token_num != self.max_width:
            return False
        runner = self._verify_backends.graph_runner(1)
        return runner is not None and len(batch.reqs) <= getattr(runner, "max_bs", 0)

    def _narrow_step(self, batch: Any, roots: torch.Tensor, on_publish, pp_proxy_tensors) -> Any:
        """A decode step with no draft for any request, where a verify graph runs it: the
        host's verify at width 1 (roots only) on the width-1 graphs, the relay padded
        back to the startup width."""
        staged = (roots.numpy().astype(np.int64), np.ones(len(batch.reqs), dtype=bool))
        result = self._verify_at_width(batch, 1, staged, on_publish, pp_proxy_tensors)
        plain_step.STATS.count(False, narrow=True)
        return result

    def _time_gate_step(self, batch: Any) -> None:
        """The previous decode step's wall time (to this step's start, the same batch
        size: what bounds decode throughput, as the adaptive controller times it)."""
        prev, self._gate_step = self._gate_step, None
        if prev is None or not batch.forward_mode.is_decode():
            return
        bs, verified, start, drafts = prev
        if bs == len(batch.reqs):
            self._gate.on_step_time(bs, verified, time.perf_counter() - start,
                                    drafts if self._ragged is not None else None)  # fmt: skip

    def after_plain_step(self, batch: Any) -> None:
        """What the host's NGRAM verify does after a step for the requests' match state."""
        cur_rids = {req.rid for req in batch.reqs}
        departed = self._prev_decode_rids - cur_rids
        if departed:
            self.ngram_corpus.erase_match_state(list(departed))
        self._prev_decode_rids = cur_rids

    # -- the draft source (the host NGRAM hooks we replace) ---------------------------
    def _local_drafts(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        self._maybe_log_stats()
        width = self.draft_token_num
        rids, roots, ok = [], [], []
        prevs = [self._unrelayed(req, prev) for req, prev in
                 zip(batch.reqs, relayed_per_request(batch, self.enable_overlap), strict=True)]  # fmt: skip
        for req, prev in zip(batch.reqs, prevs, strict=True):
            rids.append(req.rid)
            roots.append(last_token(req, prev))
            ok.append(self._guarded("sync", req.rid, self._sync, req, prev))

        # A fault may have reset the whole drafter: draft only for live sessions.
        ok = [good and rid in self.drafter for rid, good in zip(rids, ok, strict=True)]
        trees = self._drafts(batch.reqs, rids, ok, width - 1, prevs, roots)
        trees = [
            cap_tree(tree, max_draft_tokens(req))
            for tree, req in zip(trees, batch.reqs, strict=True)
        ]
        if self._gate is not None:
            if self._ragged is not None:  # each draft cut to what pays for its verify
                trees = self._gate.trim(rids, trees, width)
            elif not self._gate.decide(rids, trees):
                trees = [DraftTree() for _ in trees]  # weak drafts: a plain step pays more
        self._step_empty = not any(len(tree.parents) for tree in trees)
        try:
            packed = pack_batch(trees, roots, width)
            self._set_lens(trees)
            self._recycle_record(batch.reqs, rids, roots, trees)
            return packed
        except Exception as exc:  # a malformed draft: find it, plain-decode its request
            self._fault("pack", None, exc)
            for i, tree in enumerate(trees):
                try:
                    pack_batch([tree], [roots[i]], width)
                except Exception as tree_exc:
                    self._fault("pack", rids[i], tree_exc)
                    trees[i] = DraftTree()
            self._step_empty = not any(len(tree.parents) for tree in trees)
            self._set_lens(trees)
            self._recycle_record(batch.reqs, rids, roots, trees)
            return pack_batch(trees, roots, width)

    def _update_ngram_corpus(self, batch: Any) -> None:
        # The drafter is updated from committed tokens at the next draft
        # preparation (``_sync``, suffix_sessions.py); nothing to insert after verify.
        return None
