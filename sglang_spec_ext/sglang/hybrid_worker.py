"""The HYBRID speculative worker: the host's model-draft worker plus the SUFFIX drafter.

``--speculative-algorithm HYBRID --speculative-draft-model-path DRAFT`` runs the
host's own model-draft path (``StandaloneWorkerV2`` for a plain causal LM draft,
``EAGLEWorkerV2`` for an EAGLE or EAGLE3 head; :func:`draft_kind`) unchanged, and
adds one thing between its draft and its verify: per request, the suffix drafter's
draft replaces the model's draft when its expected accepted tokens are larger
(``sglang_spec_ext/hybrid.py``: scores of both sources mapped to accepted tokens by
statistics learned from this server's own verify results).

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
each later draft step from :mod:`~sglang_spec_ext.sglang.hybrid_confidence`, which
records them on the device inside the host's multi-step draft, so a CUDA-graph replay
(the GPU default) and an eager draft give the same scores.

Overlap scheduling is turned off for HYBRID (the suffix drafter reads each request's
committed tokens from the request, which lag one step under overlap). With
``--tp-size`` > 1 the first rank's choices and suffix rows are broadcast
(``tp_sync.TpSync``). Faults in the suffix/choice path fall back to the model draft
for that step (lossless: the model draft is verified as usual) and are counted.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import numpy as np
import torch

from sglang_spec_ext.hybrid import MODEL, SUFFIX, Candidate, HybridState, chain_score
from sglang_spec_ext.sglang import draft_kv_repair
from sglang_spec_ext.sglang import metrics as spec_metrics
from sglang_spec_ext.sglang.hybrid_confidence import ensure_tap, next_token_logits, top_prob
from sglang_spec_ext.sglang.server_args import plugin_config
from sglang_spec_ext.sglang.tp_sync import tp_sync
from sglang_spec_ext.sglang.verify_rows import read_tree, write_trees
from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.tree import tree_mask

logger = logging.getLogger("sglang_spec_ext")

#: INFO line with HYBRID's per-source figures (JSON after the mark).
STATS_LOG_MARK = "sglang-spec-ext hybrid stats: "
#: Remembered first-token probabilities beyond which those of absent requests are dropped.
FIRST_PROB_BOUND = 4096
#: Draft kinds and the host worker each runs on.
DRAFT_KINDS = ("standalone", "eagle", "eagle3")


def draft_kind_from_architectures(architectures: list[str]) -> str:
    """``eagle3`` / ``eagle`` for the host's EAGLE head architectures, else ``standalone``."""
    names = " ".join(architectures or []).lower()
    if "eagle3" in names:
        return "eagle3"
    if "eagle" in names:
        return "eagle"
    return "standalone"


def draft_kind(
    draft_path: str | None,
    setting: str = "auto",
    *,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> str:
    """The model-draft path HYBRID runs: ``setting`` unless ``auto``, else detected from
    the draft's architectures as the host resolves its config (``get_config`` of
    ``sglang.srt.utils.hf_transformers``: a local directory, a hub id from the local
    cache or the hub, a GGUF file, the ``revision`` given). A config the host cannot
    resolve is an error that names the path and the override, not a guess: a hub id
    taken for a plain causal LM would start an EAGLE head on the wrong host path."""
    if setting != "auto":
        if setting not in DRAFT_KINDS:
            raise ValueError(f"hybrid_draft={setting!r} is invalid: expected auto or {DRAFT_KINDS}")
        return setting
    if not draft_path:
        return "standalone"
    from sglang.srt.utils.hf_transformers_utils import get_config

    try:
        config = get_config(draft_path, trust_remote_code=trust_remote_code, revision=revision)
    except Exception as exc:  # the host's resolution raises OSError, ValueError, HF errors
        raise ValueError(
            f"HYBRID: cannot read the draft model's config for --speculative-draft-model-path "
            f"{draft_path!r} ({type(exc).__name__}: {exc}); give a model directory or a hub "
            "id this machine can resolve, or set SGLANG_SPEC_EXT_HYBRID_DRAFT="
            f"{'|'.join(DRAFT_KINDS)} to skip the detection"
        ) from exc
    return draft_kind_from_architectures(list(getattr(config, "architectures", None) or []))


class HybridMixin:
    """HYBRID's additions to a host model-draft worker (see the module docstring)."""

    @property
    def _width(self) -> int:
        """The verify width of the current step (adaptive step counts change it)."""
        return int(self.speculative_num_draft_tokens)

    def _init_hybrid(self) -> None:
        from sglang_spec_ext.sglang.suffix_worker import SuffixWorker

        config = plugin_config()
        self.hybrid = HybridState(config.hybrid_policy)
        self._suffix = SuffixWorker.drafting_only(use_tree=self.topk > 1)
        self._phase: str | None = None
        # the last draft extend's top probabilities, and whether the rows are already the
        # selected last position of each request (the extend graph's output)
        self._extend_probs: tuple[torch.Tensor, bool] | None = None
        self._first_prob: dict[str, float] = {}
        self._choice: list[str] = []
        self._rids: set[str] = set()
        self._hybrid_faults = 0
        self._stats_logged_at: float | None = None
        self._stats_interval = config.stats_log_interval_s
        self._tp = tp_sync()
        draft = self._draft_worker
        # the draft steps' confidence (hybrid_confidence.py): on the draft worker before
        # the host captures its draft graphs (it does so after this __init__; the capture
        # hook installs it first wherever a capture comes earlier)
        self._tap = ensure_tap(draft)
        runner_forward = draft.draft_runner.forward
        draft_fn = draft.draft
        extend_decode = draft._draft_extend_for_decode
        extend_prefill = draft._draft_extend_for_prefill

        def forward(forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
            out = runner_forward(forward_batch, *args, **kwargs)
            # an eager draft extend (a draft-KV repair forward is not one)
            if self._phase == "extend" and not draft_kv_repair.repairing():
                self._capture(out, selected=False)
            return out

        def draft_hybrid(batch: Any, *, with_topology: bool = False) -> Any:
            verify_input = draft_fn(batch, with_topology=with_topology)
            if not with_topology and not batch.forward_mode.is_idle() and batch.reqs:
                self._choose_and_splice(batch, verify_input)
            return verify_input

        def extend_for_decode(batch: Any, batch_result: Any, **kwargs: Any) -> Any:
            self._tap_extend_graphs()
            self._extend_probs = None
            self._phase = "extend"
            try:
                return extend_decode(batch, batch_result, **kwargs)
            finally:
                self._phase = None
                self._keep_first_probs(batch, batch_result.accept_lens)

        def extend_for_prefill(batch: Any, *args: Any, **kwargs: Any) -> Any:
            self._extend_probs = None
            self._phase = "extend"
            try:
                return extend_prefill(batch, *args, **kwargs)
            finally:
                self._phase = None
                self._keep_first_probs(batch, None)

        draft.draft_runner.forward = forward
        draft.draft = draft_hybrid
        draft._draft_extend_for_decode = extend_for_decode
        draft._draft_extend_for_prefill = extend_for_prefill
        logger.info(
            "HYBRID worker: %s draft, verify width %d, topk %d, steps %d, policy %s, suffix "
            "drafter backend %s",
            type(self).__name__,
            self._width,
            self.topk,
            self.speculative_num_steps,
            config.hybrid_policy,
            self._suffix.drafter.backend,
        )

    # -- the draft model's confidence --------------------------------------------
    def _tap_extend_graphs(self) -> None:
        """Read the draft extend's logits from its graph replays too (the runner is
        built after this worker's ``__init__``, when the host captures graphs)."""
        runner = getattr(self._draft_worker, "cuda_graph_runner_for_draft_extend", None)
        if runner is None or getattr(runner, "_spec_ext_tapped", False):
            return
        execute = runner.execute

        def tapped_execute(*args: Any, **kwargs: Any) -> Any:
            out = execute(*args, **kwargs)
            if self._phase == "extend":  # a replay returns the selected rows' logits
                self._capture(out, selected=True)
            return out

        runner.execute = tapped_execute
        runner._spec_ext_tapped = True

    def _capture(self, out: Any, selected: bool) -> None:
        logits = next_token_logits(out)
        if logits is not None:
            self._extend_probs = (top_prob(logits), selected)

    def _keep_first_probs(self, batch: Any, accept_lens: Any) -> None:
        """The top probability of each request's next first draft token (from the
        draft extend's logits, eager or replayed): the last committed position of each
        request."""
        captured, self._extend_probs = self._extend_probs, None
        bs = len(batch.reqs)
        if captured is None or not bs:
            return
        probs, selected = captured
        if selected and probs.numel() >= bs:  # a replay: one row per (padded) request
            rows = probs[:bs]
        elif probs.numel() == bs:
            rows = probs
        elif accept_lens is not None and probs.numel() == bs * self._width:
            lens = accept_lens.to(device=probs.device, dtype=torch.int64)
            idx = torch.arange(bs, dtype=torch.int64, device=probs.device) * self._width
            rows = probs[idx + lens - 1]
        else:
            return
        for req, p in zip(batch.reqs, rows.tolist(), strict=True):
            self._first_prob[req.rid] = float(p)

    def _model_step_probs(self, bs: int) -> np.ndarray:
        """[bs, steps - 1] top probabilities of this step's draft forwards (the best
        branch of each request for tree drafts), the same from a graph replay as from an
        eager draft (hybrid_confidence.py); no columns when the draft had none."""
        return self._tap.step_probs(bs, int(self._draft_worker.speculative_num_steps))

    # -- choice and splice ---------------------------------------------------------
    def _choose_and_splice(self, batch: Any, verify_input: Any) -> None:
        bs, width = len(batch.reqs), self._width
        self._choice = [MODEL] * bs
        try:
            self._close_departed(batch)
            flags, tokens, masks = self._decide(batch, verify_input)
        except Exception as exc:  # this rank's contribution is zero: model drafts
            self._hybrid_fault(exc)
            flags = np.zeros(bs, dtype=np.int64)
            tokens = np.zeros((bs, width), dtype=np.int64)
            masks = np.zeros((bs, width, width), dtype=bool)
        if self._tp is not None:  # outside the fault path: every rank takes part
            flags, tokens, masks = self._tp_share(flags, tokens, masks)
        try:
            rows = [b for b in range(bs) if flags[b]]
            if rows:
                self._splice(batch, verify_input, rows, tokens, masks)
            self._choice = [SUFFIX if flags[b] else MODEL for b in range(bs)]
        except Exception as exc:  # keep the model's drafts: verify stays exact
            self._hybrid_fault(exc)
            self._choice = [MODEL] * bs
        self._maybe_log_stats()
        self._suffix._maybe_log_stats()  # the SUFFIX worker's drafter-stats line, as SUFFIX logs it

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
        if len(self._first_prob) > FIRST_PROB_BOUND:  # prefilled requests that never decoded
            self._first_prob = {r: p for r, p in self._first_prob.items() if r in current}
        gone = self._rids - current
        if gone:
            self._suffix.close_sessions(sorted(gone))
            for rid in gone:
                self.hybrid.finish(rid)
                self._first_prob.pop(rid, None)
        self._rids = current

    def _decide(self, batch: Any, verify_input: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per request: whether the suffix draft wins, and its packed row (tokens, mask)."""
        bs, width = len(batch.reqs), self._width
        step_probs = self._model_step_probs(bs)
        host_tokens = verify_input.draft_token.view(bs, width).cpu().tolist()
        next_tok = verify_input.retrieve_next_token.view(bs, width).cpu().tolist()
        next_sib = verify_input.retrieve_next_sibling.view(bs, width).cpu().tolist()
        flags = np.zeros(bs, dtype=np.int64)
        tokens = np.zeros((bs, width), dtype=np.int64)
        masks = np.zeros((bs, width, width), dtype=bool)

        rids, committed = [], []
        for req in batch.reqs:
            prev = self._suffix._sessions.get(req.rid)
            before = prev.synced if prev is not None else None
            ok = self._suffix._guarded("sync", req.rid, self._suffix._sync, req, [])
            out = req.output_ids
            if ok and before is not None and len(out) >= before:
                self.hybrid.ledger.commit(req.rid, list(out[before:]))
            else:  # a new, restarted or faulted session: its pending drafts are void
                self.hybrid.finish(req.rid)
            rids.append(req.rid if ok else None)
            committed.append(len(out))
        live = [r for r in rids if r is not None and r in self._suffix.drafter]
        trees = iter(self._suffix._speculate(live, width - 1))
        for b, req in enumerate(batch.reqs):
            tree = next(trees) if rids[b] is not None and rids[b] in live else DraftTree()
            m_tokens, m_parents = read_tree(host_tokens[b], next_tok[b], next_sib[b])
            p = [self._first_prob.get(req.rid, 1.0), *step_probs[b].tolist()]
            model = Candidate(MODEL, m_tokens, m_parents, chain_score(p[: len(m_tokens)]))
            suffix = Candidate(SUFFIX, tuple(tree.tokens), tuple(tree.parents), tree.score,
                               tree.match_len)  # fmt: skip
            if self.hybrid.choose(req.rid, committed[b], suffix, model) != SUFFIX:
                continue
            flags[b] = 1
            tokens[b, 0] = host_tokens[b][0]  # the root: the last committed token
            tokens[b, 1 : 1 + len(tree.tokens)] = tree.tokens
            masks[b] = tree_mask(tree.parents, width)
        return flags, tokens, masks

    def _tp_share(self, flags: np.ndarray, tokens: np.ndarray, masks: np.ndarray) -> tuple:
        """Every TP rank splices the first rank's choices and suffix rows."""
        bs, width = tokens.shape
        packed = np.concatenate([tokens, flags[:, None]], axis=1).reshape(-1)
        packed, masks_flat = self._tp.drafts(packed, masks.reshape(-1))
        packed = packed.reshape(bs, width + 1)
        return packed[:, -1], packed[:, :-1], masks_flat.reshape(bs, width, width)

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
        out = super().verify(  # type: ignore[misc]
            batch, pp_proxy_tensors=pp_proxy_tensors, grammar_barrier=grammar_barrier
        )
        choice, self._choice = self._choice, []
        if choice and len(choice) == len(batch.reqs) and not batch.forward_mode.is_idle():
            lens = out.accept_lens.cpu().tolist()
            for source, n in zip(choice, lens, strict=True):
                self.hybrid.record(source, int(n))
            spec_metrics.note_sources(batch.reqs, choice, lens)
        return out

    def hybrid_stats(self) -> dict[str, Any]:
        stats = self.hybrid.summary()
        stats["choice_faults"] = self._hybrid_faults
        stats["suffix"] = self._suffix.drafter_stats()
        stats["learned"] = self.hybrid.estimator.table()
        return stats

    def _maybe_log_stats(self) -> None:
        now = time.monotonic()
        if self._stats_logged_at is not None and now - self._stats_logged_at < self._stats_interval:
            return
        self._stats_logged_at = now
        stats = self.hybrid_stats()
        logger.info("%s%s", STATS_LOG_MARK, json.dumps(stats, default=str))
        spec_metrics.publish_hybrid(stats)


def hybrid_worker_class(kind: str) -> type:
    """The HYBRID worker class for a draft kind (``draft_kind``)."""
    if kind == "standalone":
        from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

        base: type = StandaloneWorkerV2
    else:
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        base = EAGLEWorkerV2

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)
        self._init_hybrid()

    name = {"standalone": "HybridStandaloneWorker", "eagle": "HybridEagleWorker",
            "eagle3": "HybridEagle3Worker"}[kind]  # fmt: skip
    return type(name, (HybridMixin, base), {"__init__": __init__, "__module__": __name__})
