"""HYBRID's model draft: which host path runs it, and a draft step without it.

:func:`draft_kind` picks the host's model-draft worker HYBRID builds on
(``StandaloneWorkerV2`` for a plain causal LM, ``EAGLEWorkerV2`` for an EAGLE or
EAGLE3 head) from the draft's config as the host resolves it. :func:`draft_without_model`
runs the host's draft step with its draft forwards answered by a stub, for the steps
where the suffix draft wins for every request whatever the model would draft
(``hybrid_worker.py``).
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from sglang_spec_ext.hybrid import SUFFIX, Candidate, HybridChooser
from sglang_spec_ext.sglang import draft_kv_repair
from sglang_spec_ext.suffix.draft import DraftTree

logger = logging.getLogger("sglang_spec_ext")

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


#: Config fields in which checkpoints declare how many MTP layers they carry (DeepSeek,
#: MiMo, GLM-4 MoE and most others: ``num_nextn_predict_layers``; Qwen3-Next and Qwen3.5:
#: ``mtp_num_hidden_layers``; the host's Ernie 4.5 MTP reads ``num_mtp_modules``).
MTP_LAYER_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")


def host_draft_architecture(config: Any) -> str:
    """The architecture the host loads when ``config`` is a draft model's config: its own
    mapping (``ModelConfig._config_draft_model`` in ``srt/configs/model_config.py``), which
    names a target architecture's MTP draft class (``MiMoForCausalLM`` -> ``MiMoMTP``,
    ``DeepseekV3ForCausalLM`` -> ``DeepseekV3ForCausalLMNextN``, ...) and leaves every
    other architecture as it is. Run on a copy of ``config`` with a stand-in for the
    ``ModelConfig`` fields that mapping reads, so nothing is loaded or changed."""
    from sglang.srt.configs.model_config import ModelConfig, get_hf_text_config

    hf_config = copy.deepcopy(config)
    stand_in = SimpleNamespace(
        is_draft_model=True,
        hf_config=hf_config,
        hf_text_config=get_hf_text_config(hf_config),
        speculative_algorithm="EAGLE",  # what NEXTN resolves to
        is_draft_quantization_explicit=False,
        quantization=None,
        sliding_window_size=None,
    )
    ModelConfig._config_draft_model(stand_in)
    return str((stand_in.hf_config.architectures or [""])[0])


def declared_mtp_layers(config: Any) -> int:
    """How many MTP layers ``config`` (or its text config) declares; 0 when none."""
    from sglang.srt.configs.model_config import get_hf_text_config

    found = 0
    for cfg in (config, get_hf_text_config(config)):
        for field in MTP_LAYER_FIELDS:
            value = getattr(cfg, field, None)
            if isinstance(value, int) and not isinstance(value, bool):
                found = max(found, value)
    return found


def _architectures(config: Any) -> list[str]:
    return list(getattr(config, "architectures", None) or [])


def mtp_draft_architecture(config: Any) -> str | None:
    """The host's MTP draft class for a checkpoint that carries MTP layers (the host maps
    its architecture to one, and its config declares at least one MTP layer), else None.
    Both are needed: the host maps some architectures whose usual checkpoints have no
    MTP layers (``Qwen3MoeForCausalLM``, for one)."""
    if declared_mtp_layers(config) <= 0:
        return None
    return _host_mtp_class(config)


def _host_mtp_class(config: Any) -> str | None:
    """The host's draft class for ``config`` when it differs from the config's own
    architecture (an MTP draft class), else None. Should the host's mapping fail on a
    config, say so in the log and take the architecture as it is."""
    archs = _architectures(config)
    if not archs:
        return None
    try:
        mapped = host_draft_architecture(config)
    except Exception as exc:  # noqa: BLE001 (a host change; tests/host pin the mapping)
        logger.warning(
            "HYBRID: the host's draft-architecture mapping failed on %s (%s: %s); taking "
            "it as it is", archs[0], type(exc).__name__, exc,
        )  # fmt: skip
        return None
    return mapped if mapped != archs[0] else None


@functools.lru_cache(maxsize=8)
def target_mtp_draft(
    model_path: str, *, revision: str | None = None, trust_remote_code: bool = False
) -> tuple[str | None, str]:
    """For a target served with no draft path: ``(MTP draft architecture or None, the
    target's architecture)``, read from the target's config as the host resolves it. A
    config that cannot be read gives ``(None, "unreadable config: ...")``; the host's own
    start-up then reports it. Cached: the launcher's argument checks, the draft source and
    the argument hook all ask, and a hub id's config is not read again for each."""
    from sglang.srt.utils.hf_transformers_utils import get_config

    try:
        config = get_config(model_path, trust_remote_code=trust_remote_code, revision=revision)
    except Exception as exc:  # noqa: BLE001 (the host raises OSError, ValueError, HF errors)
        return None, f"unreadable config: {type(exc).__name__}: {exc}"
    archs = _architectures(config)
    return mtp_draft_architecture(config), (archs[0] if archs else "no architectures")


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
    cache or the hub, a GGUF file, the ``revision`` given). A checkpoint the host loads
    as its MTP draft class (a target with MTP layers, given as its own draft path) is
    ``eagle``: the host runs MTP drafts on its EAGLE path, as NEXTN does. A config the
    host cannot resolve is an error that names the path and the override, not a guess: a
    hub id taken for a plain causal LM would start an EAGLE head on the wrong host path."""
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
    kind = draft_kind_from_architectures(_architectures(config))
    # The host's draft worker loads the class its mapping names whatever the kind: an
    # MTP draft class needs the target's hidden states, so the EAGLE path.
    if kind == "standalone" and _host_mtp_class(config):
        return "eagle"
    return kind


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
