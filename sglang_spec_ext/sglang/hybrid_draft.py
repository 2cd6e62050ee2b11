"""HYBRID's model draft: which host path runs it, and a draft step without it.

:func:`draft_kind` picks the host's model-draft worker HYBRID builds on
(``StandaloneWorkerV2`` for a plain causal LM, ``EAGLEWorkerV2`` for an EAGLE or
EAGLE3 head) from the draft's config as the host resolves it. :func:`draft_without_model`
runs the host's draft step with its draft forwards answered by a stub, for the steps
where the suffix draft wins for every request whatever the model would draft
(``hybrid_worker.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from sglang_spec_ext.hybrid import SUFFIX, Candidate, HybridChooser
from sglang_spec_ext.sglang import draft_kv_repair
from sglang_spec_ext.suffix.draft import DraftTree

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


def draft_without_model(draft_worker: Any, draft_fn: Any, batch: Any) -> Any:
    """The host's draft step (``draft_fn``, the worker's own ``draft``) with its draft
    forwards answered by a stub: no model work, a verify input of the right shapes, every
    row of which the caller overwrites with a suffix draft (the root, the last committed
    token, is the host's). The draft model's KV stays right: the draft extend after the
    verify runs over the committed tokens as always, and the multi-step draft's own KV
    slots are scratch, rewritten by the next draft. The graph runner is set aside for the
    call (a replay would run the model). A draft-KV repair that runs inside the host's
    draft (``draft_kv_repair``, a BEFORE hook on it) still runs the model: it rebuilds KV
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


def hybrid_worker_class(kind: str) -> type:
    """The HYBRID worker class for a draft kind (``draft_kind``)."""
    if kind == "standalone":
        from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

        base: type = StandaloneWorkerV2
    else:
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        base = EAGLEWorkerV2

    from sglang_spec_ext.sglang.hybrid_worker import HybridMixin

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)
        self._init_hybrid()

    name = {"standalone": "HybridStandaloneWorker", "eagle": "HybridEagleWorker",
            "eagle3": "HybridEagle3Worker"}[kind]  # fmt: skip
    return type(
        name,
        (HybridMixin, base),
        {"__init__": __init__, "__module__": "sglang_spec_ext.sglang.hybrid_worker"},
    )
