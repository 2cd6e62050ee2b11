"""Pure-torch sampling verify for speculative decoding (the host's CUDA-only ops).

On its CPU engine sglang 0.5.23 has no ``tree_speculative_sampling_target_only`` and
no ``top_k_renorm_prob`` / ``top_p_renorm_prob`` (all three are ``None``), so its
verify commits argmax tokens even for sampled requests. These functions fill that
gap with the host's call signatures:

* :func:`tree_speculative_sampling_target_only` follows the host's CUDA kernel
  (``sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh``): walk the
  draft tree from the root; at the last accepted node, with one coin ``u`` for
  all its children and ``acc`` the running sum of the target probabilities of the
  children tried so far, accept child ``x`` when ``p(x) > 0`` and
  (``u < acc / threshold_acc`` or ``p(x) >= threshold_single``); a rejected child's
  probability is copied into ``draft_probs`` (so the residual excludes it) and the
  next sibling is tried. The bonus token is drawn with the final coin from
  ``relu(target - draft)`` at the last accepted node (plain ``target`` when the
  walk reached the maximum depth). With both thresholds 1 this is exact
  speculative sampling for a deterministic draft: the committed tokens are
  distributed like the target's.
  One deliberate difference: a child repeating the token of an earlier sibling
  (drafters pad their trees with token 0 under the root) counts as already
  rejected. The kernel would add its probability to ``acc`` once per copy and
  accept that token with probability ``k * p(x)``; identical otherwise.
* :func:`top_k_renorm_prob` / :func:`top_p_renorm_prob` renormalise after top-k /
  top-p filtering with the cut-off rules of the host's torch sampler
  (``top_k_top_p_min_p_sampling_from_probs_torch``), which the CPU engine uses for
  the non-speculative tokens: the ``k`` largest, and every token whose
  preceding (sorted) mass is at most ``top_p``.

This module imports torch only.
"""

from __future__ import annotations

import torch

#: The host's "no top-k" value (sglang.srt.sampling.sampling_params.TOP_K_ALL).
TOP_K_ALL = 1 << 30


def _per_row(value: torch.Tensor | float | int, rows: int, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a ``[rows, 1]`` tensor on ``like``'s device."""
    t = torch.as_tensor(value, device=like.device)
    return t.reshape(-1, 1).expand(rows, 1) if t.numel() == 1 else t.reshape(rows, 1)


def _renorm_sorted(
    probs: torch.Tensor, keep_sorted: torch.Tensor, order: torch.Tensor
) -> torch.Tensor:
    kept = torch.zeros_like(probs).scatter_(-1, order, keep_sorted)
    return kept / kept.sum(-1, keepdim=True)


def top_k_renorm_prob(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """Keep the ``top_k`` largest probabilities of each row, zero the rest and
    renormalise. ``top_k`` is an int or one value per row; values ``<= 0`` or
    ``>= vocab`` keep the whole row (the host passes ``TOP_K_ALL`` for "off")."""
    rows, vocab = probs.shape
    k = _per_row(top_k, rows, probs).to(torch.int64)
    k = torch.where((k <= 0) | (k > vocab), vocab, k)
    widest = int(k.max()) if rows else 0
    top, order = probs.topk(widest, dim=-1, sorted=True)  # only the kept ranks
    rank = torch.arange(widest, device=probs.device)
    return _renorm_sorted(probs, torch.where(rank < k, top, 0.0), order)


def top_p_renorm_prob(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """Keep, in descending order, every token whose preceding mass is at most
    ``top_p`` (so the kept mass first reaches ``top_p``), zero the rest and
    renormalise. ``top_p`` is a float or one value per row."""
    rows, _ = probs.shape
    p = _per_row(top_p, rows, probs).to(probs.dtype)
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    before = sorted_probs.cumsum(-1) - sorted_probs
    return _renorm_sorted(probs, torch.where(before > p, 0.0, sorted_probs), order)


def _sample_residual(target: torch.Tensor, draft: torch.Tensor, coin: torch.Tensor) -> torch.Tensor:
    """Per row: the first index whose inclusive cumulative ``relu(target - draft)``
    exceeds ``coin * total``; where rounding leaves none, the last index with mass,
    and ``vocab - 1`` for a row without any (the kernel's fall-backs)."""
    vocab = target.shape[-1]
    residual = (target - draft).clamp_min(0)
    cdf = residual.cumsum(-1)
    u = coin.to(cdf.dtype) * cdf[:, -1]
    positive = residual > 0
    above = (cdf > u[:, None]) & positive
    first = above.to(torch.int8).argmax(-1)
    last_valid = (vocab - 1) - positive.flip(-1).to(torch.int8).argmax(-1)
    fallback = torch.where(positive.any(-1), last_valid, vocab - 1)
    return torch.where(above.any(-1), first, fallback)


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Sampling tree verify, in place, with the host op's signature (see module doc).

    Shapes (``bs`` requests, ``n`` tree nodes, root first, ``steps`` = maximum tree
    depth + 1): ``candidates``, ``retrive_*``, ``uniform_samples`` ``[bs, n]``;
    ``target_probs`` / ``draft_probs`` ``[bs, n, vocab]`` (row ``i``: the target's
    next-token distribution after node ``i``); ``predicts`` ``[bs * n]``;
    ``accept_index`` ``[bs, steps]``; ``accept_token_num`` and
    ``uniform_samples_for_final_sampling`` ``[bs]``. Writes the accepted flat node
    indices (root first) into ``accept_index``, the number of accepted drafts into
    ``accept_token_num``, at every accepted node but the last the token accepted
    after it, and at the last one the sampled bonus token, into ``predicts``.
    Rejected children's target probabilities are written into ``draft_probs``.
    ``deterministic`` is accepted for compatibility (this version always is).
    """
    del deterministic
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    if not (0.0 <= threshold_single <= 1.0 and 0.0 <= threshold_acc <= 1.0):
        raise ValueError(f"thresholds must lie in [0, 1], got {threshold_single}, {threshold_acc}")
    if bs == 0:
        return
    vocab = target_probs.shape[-1]
    device = candidates.device
    threshold_acc = max(float(threshold_acc), 1e-9)
    probs = target_probs.reshape(bs, n, vocab)
    draft = draft_probs.view(bs, n, vocab)  # written in place, like the kernel
    coins = uniform_samples.reshape(bs, n)
    tokens = candidates.to(torch.int64)
    index = retrive_index.to(torch.int64)
    first_child = retrive_next_token.to(torch.int64)
    next_sibling = retrive_next_sibling.to(torch.int64)
    out = predicts.view(-1)
    batch = torch.arange(bs, device=device)

    last = index[:, 0].clone()  # flat index of the last accepted node
    accept_index[:, 0] = last.to(accept_index.dtype)
    row = torch.zeros(bs, dtype=torch.int64, device=device)  # its node within the tree
    accepted = torch.zeros(bs, dtype=torch.int64, device=device)
    coin = coins[:, 0].clone()
    alive = torch.ones(bs, dtype=torch.bool, device=device)
    for _ in range(1, steps):
        if not bool(alive.any()):
            break
        cur = torch.where(alive, first_child[batch, row], -1)
        acc = torch.zeros(bs, dtype=probs.dtype, device=device)
        tried = torch.full((bs, n), -1, dtype=torch.int64, device=device)
        matched = torch.zeros(bs, dtype=torch.bool, device=device)
        searching = cur != -1
        for k in range(n):  # walk the sibling list; bounded against malformed links
            if not bool(searching.any()):
                break
            node = cur.clamp_min(0)
            token = tokens[batch, node]
            repeat = (tried[:, :k] == token[:, None]).any(-1)
            tried[:, k] = token
            p = probs[batch, row, token]
            p = torch.where(searching & ~repeat, p, 0.0)
            acc = acc + p
            hit = (p > 0) & ((coin < acc / threshold_acc) | (p >= threshold_single))
            miss = searching & ~hit
            fresh = miss & ~repeat
            draft[batch[fresh], row[fresh], token[fresh]] = p[fresh].to(draft.dtype)
            if bool(hit.any()):
                rows, nodes = batch[hit], node[hit]
                out[last[hit]] = token[hit].to(out.dtype)
                accepted[hit] += 1
                accept_index[rows, accepted[hit]] = index[rows, nodes].to(accept_index.dtype)
                last[hit] = index[rows, nodes]
                row[hit] = nodes
                coin[hit] = coins[rows, nodes]
                matched |= hit
            cur = torch.where(miss, next_sibling[batch, node], cur)
            searching = miss & (cur != -1)
        alive = matched
    accept_token_num.view(-1)[:bs] = accepted.to(accept_token_num.dtype)

    target = probs[batch, row]
    at_max_depth = (accepted == steps - 1)[:, None]  # no draft probabilities there
    residual_draft = torch.where(at_max_depth, 0.0, draft[batch, row].to(target.dtype))
    final_coin = uniform_samples_for_final_sampling.reshape(-1)[:bs]
    out[last] = _sample_residual(target, residual_draft, final_coin).to(out.dtype)
