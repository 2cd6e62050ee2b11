"""Which host path runs a model draft: ``StandaloneWorkerV2`` for a plain causal LM,
``EAGLEWorkerV2`` for an EAGLE or EAGLE3 head or an MTP layer, read from the draft's
config as the host resolves it (:func:`draft_kind`), and the MTP draft class the host
loads for a target that carries MTP layers (:func:`target_mtp_draft`)."""

from __future__ import annotations

import copy
import functools
import logging
from types import SimpleNamespace
from typing import Any

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
