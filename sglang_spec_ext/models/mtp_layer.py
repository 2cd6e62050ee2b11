"""A MiMo-style multi-token-prediction (MTP) layer in plain torch + transformers, for
training one and for computing its proposals offline (no SGLang import).

It is the computation the host serves as ``MiMoMTP`` (``srt/models/mimo_mtp.py``)::

    e_q  = embed(x_{q+1}), zeroed where the position q is 0   (the host masks it)
    h'_q = input_proj([hidden_layernorm(h_q), token_layernorm(e_q)])
    g_q  = final_layernorm(mtp_block(h'_q))                  # one Qwen2 decoder layer
    logits(x_{q+2}) = lm_head(g_q)                            # the target's (tied) head

where ``h_q`` is the target's last hidden state at position ``q`` (after its final
norm: what the host's logits processor hands an EAGLE-kind draft) and the layer
attends causally over its own earlier positions. Chained steps (``steps > 1``) feed
``g`` back as the hidden state with the step's own proposal as the token, one
position further on, exactly as the host's EAGLE worker chains a draft.

The decoder layer and final norm are a one-layer ``transformers`` ``Qwen2Model`` (its
token embedding removed: inputs come in as embeddings), so rotary positions, masks and
the KV cache are transformers' own. :func:`mtp_state_dict` / :meth:`MTPLayer.load_mtp`
use the checkpoint names the host's loader maps (``model.mtp_layers.0.*``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

MTP_PREFIX = "model.mtp_layers.0."
_OWN = ("token_layernorm", "hidden_layernorm", "input_proj")


class MTPLayer(nn.Module):
    """One MTP layer sharing a target's token embedding and LM head (``lm_head``: the
    target's head weight; default the embedding, for tied-embedding targets)."""

    def __init__(
        self, config: Any, embed: nn.Embedding, lm_head: torch.Tensor | None = None
    ) -> None:
        from transformers import Qwen2Config, Qwen2Model
        from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

        super().__init__()
        if lm_head is None and not getattr(config, "tie_word_embeddings", False):
            raise ValueError("an untied target: pass its LM head weight as lm_head")
        hidden = config.hidden_size
        self.token_layernorm = Qwen2RMSNorm(hidden, eps=config.rms_norm_eps)
        self.hidden_layernorm = Qwen2RMSNorm(hidden, eps=config.rms_norm_eps)
        self.input_proj = nn.Linear(2 * hidden, hidden, bias=False)
        fields = {**config.to_dict(), "num_hidden_layers": 1, "use_sliding_window": False}
        fields.pop("layer_types", None)
        fields.pop("architectures", None)
        block_config = Qwen2Config(**fields)
        block_config._attn_implementation = "sdpa"
        self.block = Qwen2Model(block_config)
        del self.block.embed_tokens  # inputs arrive as embeddings
        self.block.embed_tokens = None
        # Not submodules: the embedding and head belong to (and are saved with) the target.
        self.__dict__["embed"] = embed
        self.__dict__["lm_weight"] = embed.weight if lm_head is None else lm_head

    def forward(
        self,
        hidden: torch.Tensor,
        next_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool = False,
    ) -> torch.Tensor:
        """``g`` for inputs ``hidden`` ``[B, T, H]`` (the target's or the previous
        step's), ``next_ids`` ``[B, T]`` (the token after each position) at
        ``position_ids`` ``[B, T]``."""
        emb = self.embed(next_ids)
        emb = emb.masked_fill((position_ids == 0)[..., None], 0.0)
        x = self.input_proj(
            torch.cat((self.hidden_layernorm(hidden), self.token_layernorm(emb)), dim=-1)
        )
        out = self.block(
            inputs_embeds=x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        return out.last_hidden_state

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return g @ self.lm_weight.t()

    def mtp_state_dict(self) -> dict[str, torch.Tensor]:
        """This layer's tensors under the host's checkpoint names."""
        out: dict[str, torch.Tensor] = {}
        for name, value in self.state_dict().items():
            if name.startswith("block.layers.0."):
                key = MTP_PREFIX + name.removeprefix("block.layers.0.")
            elif name == "block.norm.weight":
                key = MTP_PREFIX + "final_layernorm.weight"
            elif name.split(".")[0] in _OWN:
                key = MTP_PREFIX + name
            else:  # rotary buffers and the like are not checkpoint tensors
                continue
            out[key] = value.detach().clone().contiguous()
        return out

    def load_mtp(self, tensors: dict[str, torch.Tensor]) -> None:
        """Fill from ``model.mtp_layers.0.*`` tensors (inverse of :meth:`mtp_state_dict`)."""
        mine: dict[str, torch.Tensor] = {}
        for key, value in tensors.items():
            if not key.startswith(MTP_PREFIX):
                continue
            name = key.removeprefix(MTP_PREFIX)
            if name == "final_layernorm.weight":
                mine["block.norm.weight"] = value
            elif name.split(".")[0] in _OWN:
                mine[name] = value
            else:
                mine["block.layers.0." + name] = value
        missing, unexpected = self.load_state_dict(mine, strict=False)
        missing = [k for k in missing if "rotary_emb" not in k]
        if missing or unexpected:
            raise ValueError(f"MTP tensors do not fit: missing={missing} unexpected={unexpected}")


def for_target(target: Any) -> MTPLayer:
    """A new layer sharing ``target``'s (a transformers causal LM) embedding and head."""
    return MTPLayer(
        target.config, target.get_input_embeddings(), target.get_output_embeddings().weight
    )


def load_mimo_checkpoint(model_dir: Any) -> tuple[Any, MTPLayer]:
    """``(target, mtp layer)`` of a MiMo-shaped checkpoint directory (Qwen2 config, MTP
    tensors under ``model.mtp_layers.0.``), float32, eval mode."""
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model_dir = Path(model_dir)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    mtp = for_target(target)
    tensors = load_file(str(model_dir / "model.safetensors"))
    mtp.load_mtp({k: v for k, v in tensors.items() if k.startswith(MTP_PREFIX)})
    return target, mtp.eval()


def init_from_target(mtp: MTPLayer, target: Any, layer: int = -1) -> None:
    """A starting point for training: the decoder layer copies target layer ``layer``,
    the final norm copies the target's, and ``input_proj`` adds the two halves."""
    layers = target.model.layers
    src = layers[layer].state_dict()
    attn = mtp.block.layers[0].self_attn
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):  # Llama sources have no biases
        if proj.bias is not None:
            proj.bias.data.zero_()
    mtp.block.layers[0].load_state_dict({k: v.clone() for k, v in src.items()}, strict=False)
    mtp.block.norm.weight.data.copy_(target.model.norm.weight.data)
    hidden = mtp.input_proj.in_features // 2
    eye = torch.eye(hidden)
    mtp.input_proj.weight.data.copy_(torch.cat((eye, eye), dim=1) * 0.5)


def target_hidden(target: Any, ids: Sequence[int]) -> torch.Tensor:
    """The target's last hidden states (after its final norm) for ``ids``: ``[len, H]``."""
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor([list(ids)], dtype=torch.long))
    return out.last_hidden_state[0]


def mtp_chains(
    target: Any, mtp: MTPLayer, ids: Sequence[int], start: int, k: int
) -> tuple[list[list[int]], list[list[float]]]:
    """The MTP layer's greedy ``k``-step chains after every prefix ``ids[:p]``, ``p >= start``.

    After ``ids[:p]`` the newest token ``ids[p-1]`` has not been through the target yet,
    so the chain starts at MTP position ``p - 2`` from ``(h_{p-2}, ids[p-1])`` and step
    ``d`` sits at position ``p - 3 + d``; the layer's cache holds the true positions
    ``< p - 2`` (as after the host's draft extend). Returns ``(tokens, probs)`` with one
    row per ``p``, like ``benchmarks/model_drafts.greedy_chains``: ``k`` batched passes,
    the first over the whole sequence, the others one token per position with a 4D mask.
    """
    from transformers import DynamicCache

    if start < 2 or start > len(ids):
        raise ValueError(f"start={start} must be in [2, len(ids)={len(ids)}]")
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    n = len(ids) - start
    if n == 0:
        return [], []
    ctx = len(ids) - 2  # MTP positions 0 .. len-3 carry (h_q, ids[q+1])
    dtype = mtp.lm_weight.dtype
    rows = torch.arange(n)
    tokens = torch.empty((n, k), dtype=torch.long)
    probs = torch.empty((n, k), dtype=torch.float32)

    def take(g: torch.Tensor, depth: int) -> None:
        top = torch.softmax(mtp.logits(g).float(), dim=-1).max(dim=-1)
        tokens[:, depth] = top.indices
        probs[:, depth] = top.values

    with torch.inference_mode():
        hidden = target_hidden(target, ids[:ctx])
        cache = DynamicCache(config=mtp.block.config)
        g = mtp(
            hidden[None],
            torch.tensor([list(ids[1 : ctx + 1])], dtype=torch.long),
            torch.arange(ctx)[None],
            past_key_values=cache,
            use_cache=True,
        )[0]
        last = g[start - 2 : start - 2 + n]
        take(last, 0)
        # Row j (p = start + j) sees the true cached positions q <= p - 2 (pass 1's
        # entry at p - 2 is its own first step, made from the true inputs) and its own
        # entries of the later passes.
        masks = chain_masks(ctx, start - 2 + rows, k, dtype)
        for depth, mask in enumerate(masks, start=1):
            last = mtp(
                last[None],
                tokens[:, depth - 1][None],
                (start - 2 + rows + depth)[None],
                attention_mask=mask,
                past_key_values=cache,
                use_cache=True,
            )[0]
            take(last, depth)
    return tokens.tolist(), probs.tolist()


def chain_masks(
    ctx: int, visible: torch.Tensor, k: int, dtype: torch.dtype
) -> Iterator[torch.Tensor]:
    """The additive 4D attention masks of passes 2..``k`` of batched greedy chains over one
    cache: ``ctx`` cached true positions, then one group of ``n = len(visible)`` entries
    per pass. Row ``j`` sees the true positions ``0..visible[j]`` and its own entry of every
    earlier pass (its own chain so far), nothing else."""
    n = visible.shape[0]
    neg = torch.finfo(dtype).min
    rows = torch.arange(n)
    prefix = torch.where(
        torch.arange(ctx)[None, :] <= visible[:, None],
        torch.tensor(0.0, dtype=dtype),
        torch.tensor(neg, dtype=dtype),
    )
    for depth in range(1, k):
        chain = torch.full((n, depth * n), neg, dtype=dtype)
        for grp in range(depth):
            chain[rows, grp * n + rows] = 0.0
        yield torch.cat([prefix, chain], dim=1)[None, None]


def naive_mtp_chains(
    target: Any, mtp: MTPLayer, ids: Sequence[int], start: int, k: int
) -> tuple[list[list[int]], list[list[float]]]:
    """Reference for :func:`mtp_chains`: per prefix, run the layer over the true
    positions then ``k - 1`` chained single steps with the cache (slow; for checks)."""
    from transformers import DynamicCache

    all_tokens: list[list[int]] = []
    all_probs: list[list[float]] = []
    with torch.inference_mode():
        hidden = target_hidden(target, ids)
        for p in range(start, len(ids)):
            cache = DynamicCache(config=mtp.block.config)
            q = p - 2
            g = mtp(
                hidden[None, : q + 1],
                torch.tensor([list(ids[1 : q + 2])], dtype=torch.long),
                torch.arange(q + 1)[None],
                past_key_values=cache,
                use_cache=True,
            )[0, -1:]
            toks: list[int] = []
            prbs: list[float] = []
            for step in range(k):
                top = torch.softmax(mtp.logits(g).float(), dim=-1).max(dim=-1)
                toks.append(int(top.indices[0]))
                prbs.append(float(top.values[0]))
                if step + 1 < k:
                    g = mtp(
                        g[None],
                        top.indices.view(1, 1),
                        torch.tensor([[q + step + 1]]),
                        past_key_values=cache,
                        use_cache=True,
                    )[0]
            all_tokens.append(toks)
            all_probs.append(prbs)
    return all_tokens, all_probs
