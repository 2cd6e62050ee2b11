"""The HYBRID speculative worker: the host's model-draft worker plus the SUFFIX drafter.

``--speculative-algorithm HYBRID --speculative-draft-model-path DRAFT`` runs the
host's own model-draft path (``StandaloneWorkerV2`` for a plain causal LM draft,
``EAGLEWorkerV2`` for an EAGLE or EAGLE3 head; :func:`draft_kind`) unchanged, and
adds one thing between its draft and its verify: per request, the suffix drafter's
draft replaces the model's draft when its expected accepted tokens are larger
(``sglang_spec_ext/hybrid/choice.py``: scores of both sources mapped to accepted tokens by
statistics learned from this server's own verify results). It steps in by wrapping
the draft worker's ``draft`` and draft extends
(:mod:`~sglang_spec_ext.sglang.workers.hybrid_draft_hooks`).

How the replacement stays exact:

* the suffix draft is written into the host's verify input rows of that request
  (tokens, tree mask in the host's mask layout, positions, first-child and
  next-sibling links): the host verifies it exactly as it verifies its own trees,
  greedy or sampled. With ``--speculative-eagle-topk 1`` the suffix draft is a chain
  (the host treats a topk-1 accepted path as the front chain); with topk > 1 it is a
  tree of up to ``--speculative-num-draft-tokens - 1`` nodes (``spec_steps`` of the
  verify input is raised to the tree's depth bound);
* the draft model's KV cache does not depend on which draft won: the host's
  draft-extend after verify runs the draft model over the *committed* tokens, whatever
  proposed them, and the multi-step draft's own KV slots are rewritten next step.

The draft model's confidence: the top probability of the first draft token from the
draft extend's logits (its eager forward, or the rows its graph replay returns), and of
each later draft step from :mod:`~sglang_spec_ext.sglang.workers.hybrid_confidence`, which
records them on the device inside the host's multi-step draft, so a CUDA-graph replay
(the GPU default) and an eager draft give the same scores.

Overlap scheduling (the host's default for its V2 model-draft workers) stays on: the
tokens each request committed reach its suffix session from the worker's own prefill
and verify outputs (:mod:`~sglang_spec_ext.sglang.workers.hybrid_commits`), never from
``req.output_ids`` alone, which lags one step under overlap. A decode step makes at most
two device-to-host copies (``hybrid_commits.read_packed``): at its start, the previous
steps' committed tokens and accept lengths and the draft extend's first-token
probabilities (then the suffix drafts are computed on the host); after the model's
draft, its rows and per-step confidence. Where the suffix draft wins for every request
whatever the model would draft, the model does not draft (a stub answers the host's
draft forwards) and the second copy is not made. With ``--tp-size`` > 1 the first
rank's choices and suffix rows are broadcast (``tp_sync.TpSync``). Faults in the
suffix/choice path fall back to the model draft for that step (lossless) and are counted.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import numpy as np
import torch

from sglang_spec_ext.hybrid.candidate import MODEL, SUFFIX, Candidate
from sglang_spec_ext.hybrid.choice import HybridState, chain_score
from sglang_spec_ext.sglang.serving import metrics as spec_metrics
from sglang_spec_ext.sglang.serving.request_options import cap_tree, max_draft_tokens
from sglang_spec_ext.sglang.serving.server_args import plugin_config
from sglang_spec_ext.sglang.verify.rows import read_tree, write_trees
from sglang_spec_ext.sglang.workers.hybrid_commits import CommitLog, StepRows, read_packed
from sglang_spec_ext.sglang.workers.hybrid_confidence import FirstTokenProbs, ensure_tap
from sglang_spec_ext.sglang.workers.hybrid_corpora import HybridCorporaMixin
from sglang_spec_ext.sglang.workers.hybrid_draft import cut_and_whole, suffix_wins_everywhere
from sglang_spec_ext.sglang.workers.hybrid_draft_hooks import hook_draft_worker
from sglang_spec_ext.sglang.workers.hybrid_wide import PackedRows, WideStepsMixin
from sglang_spec_ext.sglang.workers.suffix_grammar import served_tokenizer_path
from sglang_spec_ext.sglang.workers.tp_sync import tp_sync
from sglang_spec_ext.suffix.draft import DraftTree

logger = logging.getLogger("sglang_spec_ext")

#: INFO line with HYBRID's per-source figures (JSON after the mark).
STATS_LOG_MARK = "sglang-spec-ext hybrid stats: "
#: Per-request records (first-token probabilities, committed tails) beyond which those
#: of requests absent from the decode batch are dropped (prefilled, never decoded).
REQUEST_STATE_BOUND = 4096


class HybridMixin(WideStepsMixin, HybridCorporaMixin):
    """HYBRID's additions to a host model-draft worker (see the module docstring)."""

    @property
    def _width(self) -> int:
        """The verify width of the current step (adaptive step counts change it)."""
        return int(self.speculative_num_draft_tokens)

    def _init_hybrid(self) -> None:
        config = plugin_config()
        self.hybrid = HybridState(config.hybrid_policy)
        # wide steps and suffix trees at topk 1: what the target's attention backend allows,
        # known once the host built it (hybrid_wide.py: init_attention_backends)
        self._init_wide(int(config.hybrid_suffix_width), float(config.draft_gate_cost))
        self._suffix: Any = None  # built once trees or chains are known (_resolve_wide)
        # the first draft token's confidence, from the draft extend (hybrid_confidence.py)
        self._first = FirstTokenProbs()
        self._choice: list[str] = []
        self._starts: list[int] | None = None  # each request's committed count at the choice
        self._rids: set[str] = set()
        # what each request committed, from this worker's own outputs (hybrid_commits.py)
        self._commits = CommitLog(keep=4 * self._pack_width() + 8)
        self._hybrid_faults = 0
        self._stats_logged_at: float | None = None
        self._stats_interval = config.stats_log_interval_s
        self._tp = tp_sync()
        # skip the model's draft forwards where the suffix draft wins regardless; one rank
        # only (on TP ranks the draft forwards are collectives every rank must run)
        self._skip_model = config.hybrid_skip_model_draft and self._tp is None
        self._skipped_steps = 0
        # the draft steps' confidence (hybrid_confidence.py): on the draft worker before
        # the host captures its draft graphs (it does so after this __init__; the capture
        # hook installs it first wherever a capture comes earlier)
        self._tap = ensure_tap(self._draft_worker)
        hook_draft_worker(self)  # its draft and draft extends (hybrid_draft_hooks.py)
        logger.info(
            "HYBRID worker: %s draft, verify width %d, topk %d, steps %d, policy %s",
            type(self).__name__,
            self._width,
            self.topk,
            self.speculative_num_steps,
            config.hybrid_policy,
        )

    def _suffix_drafter(self) -> Any:
        """The suffix drafter and its sessions: built once (a snapshot keeper's shutdown)."""
        from sglang_spec_ext.sglang.workers.suffix_worker import SuffixWorker

        suffix = SuffixWorker.drafting_only(
            use_tree=self._suffix_trees,
            tokenizer_path=served_tokenizer_path(getattr(self, "server_args", None)),
        )
        logger.info("HYBRID: suffix drafter backend %s, %s", suffix.drafter.backend,
                    "trees" if self._suffix_trees else "chains")  # fmt: skip
        return suffix

    # -- what each request committed -----------------------------------------------------
    def _read_host(self, current: list[torch.Tensor]) -> list[np.ndarray]:
        """The step's one device-to-host copy: what earlier steps left on the device
        (committed tokens, accept lengths, first-token probabilities) and ``current``.
        Applies the earlier steps' part; returns the host copies of ``current``."""
        pending, first = self._commits.unread_tensors(), self._first.unread()
        host = read_packed([*pending, *first, *current])
        for rows in self._commits.apply(host[: len(pending)]):
            if rows.extra is None:  # a prefill, or a verify with no choice
                continue
            lens = rows.host_lens.tolist()
            for (source, req), start, n in zip(rows.extra, rows.starts, lens, strict=True):
                # not a step the scheduler ran past a request's end and dropped (overlap
                # launches step N+1 before it sees that step N finished the request)
                if not (req.finished() and start >= len(req.output_ids)):
                    self.hybrid.record(source, int(n))
        self._first.apply(host[len(pending) : len(pending) + len(first)])
        return host[len(pending) + len(first) :]

    def _model_step_probs(self, bs: int) -> np.ndarray:
        """[bs, steps - 1] top probabilities of this step's draft forwards (the best
        branch of each request for tree drafts), the same from a graph replay as from an
        eager draft (hybrid_confidence.py); no columns when the draft had none."""
        return self._tap.step_probs(bs, int(self._draft_worker.speculative_num_steps))

    # -- choice and splice ---------------------------------------------------------
    def _suffix_drafts(self, batch: Any) -> tuple[list[DraftTree | None], list[int]]:
        """Before the model drafts: the previous steps' outputs on the host (their one
        copy), each request's suffix session brought up to date, and its suffix draft;
        with each request's committed-token count."""
        self._starts = None
        self._resolve_wide()  # where the host did not call init_attention_backends first
        self._read_host([])
        self._close_departed(batch)
        slots = self._pack_width() - 1
        rids, committed, relayed = [], [], []
        for req in batch.reqs:
            out = req.output_ids
            total, beyond, resynced = self._commits.committed(req.rid, out)
            if resynced:  # the record disagreed with output_ids: restart this request
                self._suffix.close_sessions([req.rid])
            prev = self._suffix._sessions.get(req.rid)
            before = prev.synced if prev is not None else None
            ok = self._suffix._guarded("sync", req.rid, self._suffix._sync, req, beyond)
            if ok and before is not None and total >= before:
                new = list(out[before:]) + beyond[max(0, before - len(out)) :]
                self.hybrid.ledger.commit(req.rid, new)
            else:  # a new, restarted or faulted session: its pending drafts are void
                self.hybrid.finish(req.rid)
            rids.append(req.rid if ok else None)
            committed.append(total)
            relayed.append(beyond)
        self._starts = committed
        ok = [r is not None and r in self._suffix.drafter for r in rids]
        # grammar requests' drafts shaped by their grammar (suffix_grammar.py)
        trees = self._suffix._drafts(batch.reqs, [r or "" for r in rids], ok, slots, relayed)
        drafts = [
            cap_tree(tree, max_draft_tokens(req)) if good else None
            for tree, good, req in zip(trees, ok, batch.reqs, strict=True)
        ]
        return drafts, committed

    def _model_not_needed(self, batch: Any, drafts: list, committed: list[int]) -> bool:
        if not self._skip_model:
            return False
        steps = int(self._draft_worker.speculative_num_steps)
        first = [self._first.get(req.rid) for req in batch.reqs]
        cut = [None if t is None else t.first(self._width - 1) for t in drafts]  # as chosen
        return suffix_wins_everywhere(self.hybrid.chooser, cut, first, steps)

    def _choose_and_splice(
        self, batch: Any, verify_input: Any, drafted: Any, skipped: bool = False
    ) -> Any:
        """The choice per request and the winning suffix drafts in the verify input;
        returns the step's verify input (a wider one for a wide step, hybrid_wide.py)."""
        bs, width, pack = len(batch.reqs), self._width, self._pack_width()
        self._choice = [MODEL] * bs
        self._block_wide(verify_input)
        try:
            if isinstance(drafted, BaseException):
                raise drafted
            if skipped:
                flags, tokens, masks, lens = self._take_suffix(batch, *drafted)
            else:
                flags, tokens, masks, lens = self._decide(batch, verify_input, *drafted)
        except Exception as exc:  # this rank's contribution is zero: model drafts
            self._hybrid_fault(exc)
            flags = np.zeros(bs, dtype=np.int64)
            lens = np.zeros(bs, dtype=np.int64)
            tokens = np.zeros((bs, pack), dtype=np.int64)
            masks = np.zeros((bs, pack, pack), dtype=bool)
        if self._tp is not None:  # outside the fault path: every rank takes part
            flags, tokens, masks, lens = self._tp_share(flags, tokens, masks, lens)
        try:
            rows = [b for b in range(bs) if flags[b]]
            step = max(width, 1 + int(lens[rows].max())) if rows else width
            if step > width:  # every row rewritten, the model's from the host copy
                verify_input = self._widen(batch, verify_input, tokens[:, :step],
                                           masks[:, :step, :step])  # fmt: skip
                self._step_width = step
                self._wide_stats.verify_tokens += bs * step
                self._plan_ragged(verify_input, lens, step)
            elif rows:
                self._splice(batch, verify_input, rows, tokens[:, :width],
                             masks[:, :width, :width])  # fmt: skip
            self._mark_tree_step(verify_input, rows)
            self._choice = [SUFFIX if flags[b] else MODEL for b in range(bs)]
        except Exception as exc:  # keep the model's drafts: verify stays exact
            self._hybrid_fault(exc)
            self._narrow_back()
            self._choice = [MODEL] * bs
        self._maybe_log_stats()
        self._suffix._maybe_log_stats()  # the SUFFIX worker's drafter-stats line, as SUFFIX logs it
        return verify_input

    def _hybrid_fault(self, exc: BaseException) -> None:
        self._hybrid_faults += 1
        if self._hybrid_faults == 1 or self._hybrid_faults % 1000 == 0:
            logger.warning(
                "HYBRID: suffix drafting or choice failed (%s: %s); model drafts for this "
                "step; %d such steps so far",
                type(exc).__name__,
                exc,
                self._hybrid_faults,
                exc_info=self._hybrid_faults == 1,
            )

    def _close_departed(self, batch: Any) -> None:
        current = {req.rid for req in batch.reqs}
        self._first.keep_only(current, REQUEST_STATE_BOUND)
        self._commits.keep_only(current, REQUEST_STATE_BOUND)
        gone = self._rids - current
        if gone:
            self._suffix.close_sessions(sorted(gone))
            self._commits.forget(gone)
            self._first.forget(gone)
            for rid in gone:
                self.hybrid.finish(rid)
        self._rids = current

    def _decide(
        self, batch: Any, verify_input: Any, drafts: list, committed: list[int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per request: whether the suffix draft wins, and the row the step verifies
        (tokens, mask, node count; the model's where it wins). The model's draft (tokens,
        links, per-step confidence) is this step's second and last host copy."""
        bs, width = len(batch.reqs), self._width
        rows = self._tap.step_rows(bs, int(self._draft_worker.speculative_num_steps))
        views = [verify_input.draft_token.view(bs, width),
                 verify_input.retrieve_next_token.view(bs, width),
                 verify_input.retrieve_next_sibling.view(bs, width)]  # fmt: skip
        host = self._read_host(views if rows is None else [*views, rows])
        host_tokens, next_tok, next_sib = (a.tolist() for a in host[:3])
        step_probs = host[3] if rows is not None else np.zeros((bs, 0))
        packed = PackedRows(bs, self._pack_width())
        trees: list[DraftTree | None] = [None] * bs
        models: list[Candidate | None] = [None] * bs
        for b, req in enumerate(batch.reqs):
            tree = drafts[b] if drafts[b] is not None else DraftTree()
            m_tokens, m_parents = read_tree(host_tokens[b], next_tok[b], next_sib[b])
            p = [self._first.get(req.rid), *step_probs[b].tolist()]
            model = models[b] = Candidate(MODEL, m_tokens, m_parents,
                                          chain_score(p[: len(m_tokens)]))  # fmt: skip
            packed.tokens[b, 0] = host_tokens[b][0]  # the root: the last committed token
            # chosen on the suffix draft cut to the model's width (as without wide steps);
            # the whole draft is what a wide step may verify (hybrid_wide.py)
            suffix, whole = cut_and_whole(tree, width - 1)
            cap = max_draft_tokens(req)
            if cap is not None and len(m_tokens) > cap:  # the request's cap: its cut suffix draft
                self.hybrid.take_suffix(req.rid, committed[b], suffix, whole)
            elif self.hybrid.choose(req.rid, committed[b], suffix, model, whole) != SUFFIX:
                packed.write(b, m_tokens, m_parents)
                continue
            packed.flags[b] = 1
            packed.write(b, tree.tokens, tree.parents)
            trees[b] = tree
        self._fit_width(packed, trees, models)
        return packed.flags, packed.tokens, packed.masks, packed.lens

    def _take_suffix(
        self, batch: Any, drafts: list, committed: list[int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every request's suffix draft (the model did not draft); no host read."""
        bs = len(batch.reqs)
        self._skipped_steps += 1
        packed = PackedRows(bs, self._pack_width())  # the root stays the host's
        for b, req in enumerate(batch.reqs):
            tree = drafts[b]
            self.hybrid.take_suffix(req.rid, committed[b], *cut_and_whole(tree, self._width - 1))
            packed.write(b, tree.tokens, tree.parents)
        packed.flags[:] = 1
        self._fit_width(packed, list(drafts), [None] * bs)
        return packed.flags, packed.tokens, packed.masks, packed.lens

    def _tp_share(
        self, flags: np.ndarray, tokens: np.ndarray, masks: np.ndarray, lens: np.ndarray
    ) -> tuple:
        """Every TP rank verifies the first rank's choices and rows."""
        bs, width = tokens.shape
        packed = np.concatenate([tokens, flags[:, None], lens[:, None]], axis=1).reshape(-1)
        packed, masks_flat = self._tp.drafts(packed, masks.reshape(-1))
        packed = packed.reshape(bs, width + 2)
        return (packed[:, -2], packed[:, :-2], masks_flat.reshape(bs, width, width),
                packed[:, -1])  # fmt: skip

    def _splice(
        self, batch: Any, vi: Any, rows: list[int], tokens: np.ndarray, masks: np.ndarray
    ) -> None:
        """Write the suffix rows into the host's verify input, in its layouts."""
        write_trees(vi, batch.seq_lens, rows, tokens, masks, int(self._mask_mode()))

    def _mask_mode(self) -> Any:
        verify_mask = getattr(self.target_worker.model_runner.attn_backend, "verify_mask", None)
        if verify_mask is not None:
            return verify_mask.mode
        return self._draft_worker.tree_mask_mode

    # -- verify bookkeeping ----------------------------------------------------------
    def verify(self, batch: Any, pp_proxy_tensors: Any = None, grammar_barrier: Any = None) -> Any:
        topk, self.topk = self.topk, self.verify_topk()  # suffix trees at topk 1: compacted
        try:
            out = super().verify(  # type: ignore[misc]
                batch, pp_proxy_tensors=pp_proxy_tensors, grammar_barrier=grammar_barrier
            )
        finally:
            self.topk, self._tree_step, self._ragged_plan = topk, False, None
        choice, self._choice = self._choice, []
        starts, self._starts = self._starts, None
        reqs = batch.reqs
        if batch.forward_mode.is_idle() or not reqs:
            return out
        if starts is None or len(starts) != len(reqs):  # no choice this step (a fault)
            starts = [self._commits.start_of(r.rid, r.output_ids) for r in reqs]
        extra = None
        if choice and len(choice) == len(reqs):
            # per-request source figures, counted where the host reads this step's
            # results on the host (metrics.py), not here
            out.spec_ext_sources = choice
            extra = list(zip(choice, reqs, strict=True))
        # the committed tokens, learned from and drafted on at the next step's host copy
        bs = len(reqs)
        tokens = out.next_token_ids.view(bs, -1)
        self._commits.stash(StepRows([r.rid for r in reqs], starts, tokens, out.accept_lens, extra))
        return out

    def hybrid_stats(self) -> dict[str, Any]:
        stats = self.hybrid.summary()
        stats["choice_faults"] = self._hybrid_faults
        stats["commit_resyncs"] = self._commits.resyncs
        stats["model_draft_skipped_steps"] = self._skipped_steps
        stats["suffix"] = self._suffix.drafter_stats()
        stats["learned"] = self.hybrid.estimator.table()
        stats["wide"] = self.wide_stats()
        return stats

    def _maybe_log_stats(self) -> None:
        now = time.monotonic()
        if self._stats_logged_at is not None and now - self._stats_logged_at < self._stats_interval:
            return
        self._stats_logged_at = now
        stats = self.hybrid_stats()
        logger.info("%s%s", STATS_LOG_MARK, json.dumps(stats, default=str))
        spec_metrics.publish_hybrid(stats)
