"""MTP layers written into the tiny family checkpoints (``families.py``): each turns a
random target into the same checkpoint with the model's own multi-token-prediction layer,
named as the real checkpoints name it, so the host loads it as that family's MTP draft.

Each copies a target layer and passes the token half of its input projection through, so
the draft is the copied layer run one token ahead: sometimes right, seldom on random
weights (as the tiny MiMo's, ``mtp.py``). Run by ``families._build_cached`` on the model
before it is saved (the builders' ``tweak``). Nothing imports SGLang here.
"""

from __future__ import annotations

from typing import Any


def _norm(value: Any) -> Any:
    """A module holding one norm weight (saved as ``<name>.weight``)."""
    import torch

    module = torch.nn.Module()
    module.weight = torch.nn.Parameter(value.clone())
    return module


def deepseek_nextn(model: Any, seed: int) -> None:
    """The last decoder layer becomes the NextN MTP layer (``build_tiny_deepseek_v3``):
    a copy of the layer before it, with the MTP's own modules added under it."""
    import torch

    layers = model.model.layers
    last = len(layers) - 1
    mtp = layers[last]
    mtp.load_state_dict(layers[last - 1].state_dict())
    hidden = model.config.hidden_size

    # eh_proj([enorm(embed(x)), hnorm(h)]): the token half through, the hidden half dropped;
    # enorm gives the embedding its own RMS back, so the copied layer sees its usual scale.
    mtp.eh_proj = torch.nn.Linear(2 * hidden, hidden, bias=False)
    mtp.eh_proj.weight.data = torch.cat((torch.eye(hidden), torch.zeros(hidden, hidden)), 1)
    rms = model.model.embed_tokens.weight.pow(2).mean().sqrt()
    mtp.enorm = _norm(torch.full((hidden,), float(rms)))
    mtp.hnorm = _norm(torch.ones(hidden))
    mtp.shared_head = torch.nn.Module()
    mtp.shared_head.norm = _norm(model.model.norm.weight.data)
    model.config.num_hidden_layers = last
    model.config.num_nextn_predict_layers = 1


def qwen3_next_mtp(model: Any, seed: int) -> None:
    """Add the MTP layer (``build_tiny_qwen3_next(mtp=True)``). Qwen3-Next's norms are
    Gemma-style (``x * (1 + w)``)."""
    import copy

    import torch

    layers = model.model.layers
    full = [i for i, t in enumerate(model.config.layer_types) if t == "full_attention"]
    hidden = model.config.hidden_size

    mtp = torch.nn.Module()
    mtp.fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
    mtp.fc.weight.data = torch.cat((torch.eye(hidden), torch.zeros(hidden, hidden)), 1)
    rms = float(model.model.embed_tokens.weight.pow(2).mean().sqrt())
    mtp.pre_fc_norm_embedding = _norm(torch.full((hidden,), rms - 1.0))
    mtp.pre_fc_norm_hidden = _norm(torch.zeros(hidden))
    mtp.layers = torch.nn.ModuleList([copy.deepcopy(layers[full[-1]])])
    mtp.norm = _norm(model.model.norm.weight.data)
    model.mtp = mtp
    model.config.mtp_num_hidden_layers = 1  # what Qwen3-Next's config.json says
