"""HYBRID's model draft step without the model, and the suffix draft as a candidate.

:func:`draft_without_model` runs the host's draft step with its draft forwards answered
by a stub, for the steps where the suffix draft wins for every request whatever the model
would draft (called from the draft-worker hooks, ``hybrid_draft_hooks.py``). Which host
path runs the model draft is ``sglang/model_drafts/draft_kind.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from sglang_spec_ext.hybrid.candidate import SUFFIX, Candidate
from sglang_spec_ext.hybrid.choice import HybridChooser
from sglang_spec_ext.sglang.model_drafts import kv_repair_forward as draft_kv_repair
from sglang_spec_ext.suffix.draft import DraftTree

logger = logging.getLogger("sglang_spec_ext")


def draft_without_model(draft_worker: Any, draft_fn: Any, batch: Any) -> Any:
    """The host's draft step (``draft_fn``, the worker's own ``draft``) with its draft
    forwards answered by a stub: no model work, a verify input of the right shapes, every
    row of which the caller overwrites with a suffix draft (the root, the last committed
    token, is the host's). The draft model's KV stays right: the draft extend after the
    verify runs over the committed tokens as always, and the multi-step draft's own KV
    slots are scratch, rewritten by the next draft. The graph runner is set aside for the
    call (a replay would run the model). A draft-KV repair that runs inside the host's
    draft (``kv_repair.py``, a BEFORE hook on it) still runs the model: it rebuilds KV
    the next drafts need."""
    graphs, forward = draft_worker.cuda_graph_runner, draft_worker.draft_runner.forward
    width = max(int(draft_worker.topk), 2)  # any logits at least topk wide give a valid tree

    def no_forward(forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        if draft_kv_repair.repairing():  # the draft-KV repair's extend (inside draft) is real
            return forward(forward_batch, *args, **kwargs)
        ids = forward_batch.input_ids
        logits = torch.zeros((ids.shape[0], width), dtype=torch.float32, device=ids.device)
        hidden = getattr(forward_batch.spec_info, "hidden_states", None)
        return SimpleNamespace(
            logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=hidden)
        )

    draft_worker.cuda_graph_runner, draft_worker.draft_runner.forward = None, no_forward
    try:
        return draft_fn(batch, with_topology=False)
    finally:
        draft_worker.cuda_graph_runner, draft_worker.draft_runner.forward = graphs, forward


def suffix_candidate(tree: DraftTree) -> Candidate:
    """A suffix drafter's tree as HYBRID's candidate."""
    return Candidate(SUFFIX, tuple(tree.tokens), tuple(tree.parents), tree.score, tree.match_len)


def cut_and_whole(tree: DraftTree, cut: int) -> tuple[Candidate, Candidate | None]:
    """The suffix draft cut to ``cut`` nodes as a candidate (what HYBRID chooses on), and
    the whole one where longer (what a wide step may verify, ``hybrid_wide.py``)."""
    short = tree.first(cut)
    whole = suffix_candidate(tree) if len(tree) > len(short) else None
    return suffix_candidate(short), whole


def suffix_wins_everywhere(
    chooser: HybridChooser, drafts: Sequence[DraftTree | None], first_probs: Sequence[float],
    steps: int,
) -> bool:  # fmt: skip
    """Whether every request's suffix draft wins whatever the model would draft
    (``HybridChooser.suffix_wins_before_model_drafts``: the model's first-token
    probability and its step count bound its score); a request with no suffix session
    (None) needs the model."""
    return all(
        tree is not None
        and chooser.suffix_wins_before_model_drafts(suffix_candidate(tree), p, steps)
        for tree, p in zip(drafts, first_probs, strict=True)
    )
