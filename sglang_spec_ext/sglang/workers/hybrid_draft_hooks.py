"""Where HYBRID steps into the host's draft worker: four of its methods, wrapped.

:func:`hook_draft_worker` replaces, on one HYBRID worker's draft worker (instance
attributes: the class and every other server's draft worker stay the host's, unlike
the class-level hooks of ``sglang/host/hooks.py``):

* ``draft``: the suffix drafts first (``HybridMixin._suffix_drafts``); where they win for
  every request whatever the model would draft, the host's draft step runs with a stub
  for its forwards (``hybrid_draft.draft_without_model``); then the choice per request
  and the splice of the winning suffix drafts into the verify input
  (``HybridMixin._choose_and_splice``; a wide step returns a wider verify input,
  ``hybrid_wide.py``);
* ``draft_runner.forward``: the first draft token's probabilities from an eager draft
  extend's logits (``hybrid_confidence.FirstTokenProbs``);
* ``_draft_extend_for_decode`` / ``_draft_extend_for_prefill``: the bounds of a draft
  extend for those probabilities (and the graph runner's rows), and a prefill's first
  committed tokens for the commit log (``hybrid_commits.CommitLog.stash_prefill``).
"""

from __future__ import annotations

from typing import Any

from sglang_spec_ext.sglang.workers.hybrid_draft import draft_without_model


def hook_draft_worker(worker: Any) -> None:
    """Wrap ``worker._draft_worker``'s methods for the HYBRID ``worker`` (a
    ``hybrid_worker.HybridMixin``; see the module doc)."""
    draft = worker._draft_worker
    runner_forward = draft.draft_runner.forward
    draft_fn = draft.draft
    extend_decode = draft._draft_extend_for_decode
    extend_prefill = draft._draft_extend_for_prefill

    def forward(forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        out = runner_forward(forward_batch, *args, **kwargs)
        worker._first.capture(out, selected=False)  # inside an eager draft extend only
        return out

    def draft_hybrid(batch: Any, *, with_topology: bool = False) -> Any:
        if with_topology or batch.forward_mode.is_idle() or not batch.reqs:
            return draft_fn(batch, with_topology=with_topology)
        try:  # the suffix drafts first: the model need not draft where they win anyway
            drafted: Any = worker._suffix_drafts(batch)
            skip = worker._model_not_needed(batch, *drafted)
        except Exception as exc:  # counted in _choose_and_splice: model drafts only
            drafted, skip = exc, False
        if skip:
            try:  # the V2 draft writes slots reserved per request: a retry allocates nothing
                verify_input = draft_without_model(worker._draft_worker, draft_fn, batch)
            except Exception as exc:  # never again on this server; the model drafts
                worker._skip_model = False
                worker._hybrid_fault(exc)
            else:
                return worker._choose_and_splice(batch, verify_input, drafted, skipped=True)
        verify_input = draft_fn(batch, with_topology=False)
        return worker._choose_and_splice(batch, verify_input, drafted)

    def extend_for_decode(batch: Any, batch_result: Any, **kwargs: Any) -> Any:
        worker._first.tap_graph_runner(getattr(draft, "cuda_graph_runner_for_draft_extend", None))
        worker._first.begin()
        try:
            return extend_decode(batch, batch_result, **kwargs)
        finally:
            rids = [r.rid for r in batch.reqs]
            worker._first.end(rids, batch_result.accept_lens, worker._width)

    def extend_for_prefill(batch: Any, *args: Any, **kwargs: Any) -> Any:
        worker._first.begin()
        try:
            return extend_prefill(batch, *args, **kwargs)
        finally:
            worker._first.end([r.rid for r in batch.reqs], None, worker._width)
            if len(args) >= 2 and not batch.forward_mode.is_idle():
                worker._commits.stash_prefill(batch.reqs, args[1])  # (hidden, next ids, ..)

    draft.draft_runner.forward = forward
    draft.draft = draft_hybrid
    draft._draft_extend_for_decode = extend_for_decode
    draft._draft_extend_for_prefill = extend_for_prefill
