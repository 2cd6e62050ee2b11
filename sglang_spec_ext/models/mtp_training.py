"""Train an MTP layer (:mod:`sglang_spec_ext.models.mtp_layer`) on a frozen target, on CPU.

Self-distillation: for every sequence the target's last hidden states ``h`` and, at
each position, its next-token distribution are computed once; the layer at position
``q`` sees ``(h_q, x_{q+1})`` and learns the target's distribution for ``x_{q+2}``
(the target's top ``k`` tokens, renormalised, plus its top-1 as a hard label). Under
greedy decoding that top-1 is exactly the token the target will verify, so the
held-out top-1 agreement on the target's own outputs is the step-1 acceptance rate.

Engine-agnostic (torch + transformers; no SGLang import). The target must tie its
embedding and LM head (the layer shares both).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sglang_spec_ext.models.mtp_layer import MTPLayer, for_target, init_from_target


@dataclass
class Sample:
    """One training sequence: token ids, the target's hidden states, the target's
    top-k distribution for the token after next at every position, and where the
    target's own (greedy) output starts (``len(ids)`` for plain text)."""

    ids: torch.Tensor  # [L] long
    hidden: torch.Tensor  # [L, H] float32
    top_idx: torch.Tensor  # [L - 1, k] long: for MTP position q, the target's top-k for x_{q+2}
    top_p: torch.Tensor  # [L - 1, k] float32
    out_start: int


@dataclass
class TrainConfig:
    """Optimisation settings (the defaults train SmolLM2-135M's layer in about 10 CPU minutes
    on the default data: benchmarks/results/smollm2_mtp_training.json)."""

    epochs: int = 4
    tokens_per_step: int = 1024
    lr: float = 1e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    hard_weight: float = 0.5  # loss = hard * CE(top-1) + (1 - hard) * CE(top-k renormalised)
    init: str = "random"  # "random" (transformers' init) or "copy": the block copies init_layer
    init_layer: int = -1
    seed: int = 0
    stats: dict[str, Any] = field(default_factory=dict)


def extract_samples(
    target: Any,
    sequences: Sequence[tuple[Sequence[int], int]],
    *,
    top_k: int = 16,
    progress: Callable[[int], None] | None = None,
) -> list[Sample]:
    """Run the frozen target once over each ``(ids, out_start)`` sequence."""
    weight = target.get_output_embeddings().weight
    samples: list[Sample] = []
    with torch.inference_mode():
        for ids, out_start in sequences:
            x = torch.tensor([list(ids)], dtype=torch.long)
            hidden = target.model(input_ids=x).last_hidden_state[0].float()
            probs = torch.softmax(hidden[1:] @ weight.t().float(), dim=-1)
            top = probs.topk(top_k, dim=-1)
            samples.append(
                Sample(
                    x[0].clone(), hidden.clone(), top.indices.clone(), top.values.clone(), out_start
                )  # fmt: skip
            )
            if progress is not None:
                progress(len(ids))
    return samples


def _batches(
    samples: Sequence[Sample], tokens_per_step: int, rng: random.Random
) -> list[list[int]]:
    """Index groups of similar length, about ``tokens_per_step`` padded tokens each."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].ids))
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = max([len(samples[j].ids) for j in cur] + [len(samples[i].ids)])
        if cur and longest * (len(cur) + 1) > tokens_per_step:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    rng.shuffle(groups)
    return groups


def _collate(samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
    n = max(len(s.ids) for s in samples) - 1
    b, h, k = len(samples), samples[0].hidden.shape[1], samples[0].top_idx.shape[1]
    hidden = torch.zeros((b, n, h))
    next_ids = torch.zeros((b, n), dtype=torch.long)
    top_idx = torch.zeros((b, n, k), dtype=torch.long)
    top_p = torch.zeros((b, n, k))
    valid = torch.zeros((b, n), dtype=torch.bool)
    for row, s in enumerate(samples):
        m = len(s.ids) - 1
        hidden[row, :m] = s.hidden[:m]
        next_ids[row, :m] = s.ids[1:]
        top_idx[row, :m] = s.top_idx
        top_p[row, :m] = s.top_p
        valid[row, :m] = True
    positions = torch.arange(n)[None].expand(b, n)
    return {"hidden": hidden, "next_ids": next_ids, "positions": positions,
            "top_idx": top_idx, "top_p": top_p, "valid": valid}  # fmt: skip


def mtp_loss(mtp: MTPLayer, batch: dict[str, torch.Tensor], hard_weight: float) -> torch.Tensor:
    g = mtp(batch["hidden"], batch["next_ids"], batch["positions"])
    valid = batch["valid"]
    logp = torch.log_softmax(mtp.logits(g[valid]), dim=-1)
    top_idx, top_p = batch["top_idx"][valid], batch["top_p"][valid]
    hard = -logp.gather(1, top_idx[:, :1]).mean()
    soft_t = top_p / top_p.sum(dim=-1, keepdim=True)
    soft = -(soft_t * logp.gather(1, top_idx)).sum(dim=-1).mean()
    return hard_weight * hard + (1.0 - hard_weight) * soft


def train_mtp(
    target: Any,
    samples: Sequence[Sample],
    cfg: TrainConfig,
    *,
    progress: Callable[[int, float], None] | None = None,
) -> MTPLayer:
    """A new MTP layer trained on ``samples`` (the target stays frozen)."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    mtp = for_target(target)
    if cfg.init == "copy":
        init_from_target(mtp, target, cfg.init_layer)
    elif cfg.init == "random":
        mtp.block.norm.weight.data.copy_(target.model.norm.weight.data)
    else:
        raise ValueError(f"init must be 'random' or 'copy', not {cfg.init!r}")
    for p in target.parameters():
        p.requires_grad_(False)
    params = [p for p in mtp.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    plan = [_batches(samples, cfg.tokens_per_step, rng) for _ in range(cfg.epochs)]
    total = sum(len(p) for p in plan)

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(total - cfg.warmup_steps, 1)
        return cfg.lr * (
            cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))
        )

    mtp.train()
    step = 0
    t0 = time.process_time()
    losses: list[float] = []
    for groups in plan:
        for group in groups:
            for pg in opt.param_groups:
                pg["lr"] = lr_at(step)
            loss = mtp_loss(mtp, _collate([samples[i] for i in group]), cfg.hard_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(float(loss.detach()))
            step += 1
            if progress is not None:
                progress(step, losses[-1])
    mtp.eval()
    cfg.stats.update(steps=total, train_cpu_s=round(time.process_time() - t0, 1),
                     first_loss=round(losses[0], 4), last_loss=round(sum(losses[-10:]) / min(10, len(losses)), 4))  # fmt: skip
    return mtp


def step1_agreement(mtp: MTPLayer, samples: Sequence[Sample], *, output_only: bool = True) -> dict:
    """How often the layer's top-1 for ``x_{q+2}`` equals the target's: over the
    target's own output tokens (the step-1 acceptance rate under greedy decoding)."""
    agree = total = 0
    with torch.inference_mode():
        for s in samples:
            n = len(s.ids) - 1
            g = mtp(s.hidden[None, :n], s.ids[None, 1:], torch.arange(n)[None])[0]
            pred = mtp.logits(g).argmax(dim=-1)
            hit = pred == s.top_idx[:, 0]
            # MTP position q proposes token q + 2: count it where q + 2 is an output token.
            first = max(s.out_start - 2, 0) if output_only else 0
            agree += int(hit[first:].sum())
            total += n - first
    return {"agree": agree, "positions": total, "rate": round(agree / total, 4) if total else None}
