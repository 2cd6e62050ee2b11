"""Sampling tree verify on CPU commits tokens distributed exactly like the target.

Thousands of identical requests go through one batched verify; the empirical joint
distribution of the first two committed tokens (a second verify step supplies the
second token where the first step accepted no draft) and of the last accepted node
(hence the accept length) are compared with the exact values by Pearson's
chi-square test, seeded, so every run sees the same p-values. Negative controls: the
same test flags greedy verify, the host's threshold variants, a verifier that skips
the residual, and the literal kernel on a tree padded with repeated tokens.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest
import torch

from sglang_spec_ext.sglang.cpu.fallbacks import ops
from sglang_spec_ext.sglang.cpu.fallbacks.sampling import (
    TOP_K_ALL,
    top_k_renorm_prob,
    top_p_renorm_prob,
    tree_speculative_sampling_target_only,
)

VOCAB = 7
TRIALS = 12_000
PASS_P = 1e-3  # a correct verifier must not look this unlikely (fixed seeds: no flakes)
DETECT_P = 1e-6  # a biased one must
Verifier = Callable[..., None]


# -- synthetic target and draft trees -----------------------------------------------------


class Target:
    """Next-token distributions p(.|context), drawn once per context from a seed.
    Some contexts give one token probability 0 (a draft the kernel must never accept)."""

    def __init__(self, seed: int, sharpness: float = 1.5) -> None:
        self.seed, self.sharpness, self._cache = seed, sharpness, {}

    def logits(self, ctx: tuple[int, ...]) -> torch.Tensor:
        if ctx not in self._cache:
            g = torch.Generator().manual_seed(hash((self.seed, *ctx)) & 0x7FFFFFFF)
            z = torch.randn(VOCAB, generator=g, dtype=torch.float64) * self.sharpness
            if torch.rand(1, generator=g).item() < 0.4:
                z[torch.randint(VOCAB, (1,), generator=g)] = -torch.inf
            self._cache[ctx] = z
        return self._cache[ctx]

    def probs(self, ctx: tuple[int, ...]) -> torch.Tensor:
        return torch.softmax(self.logits(ctx), -1).float()


class Tree:
    """A draft tree: ``parents[0] == -1`` (the root, the last committed token)."""

    def __init__(self, parents: list[int], tokens: list[int]) -> None:
        self.parents, self.tokens, self.n = parents, tokens, len(parents)
        self.paths: list[tuple[int, ...]] = [()]
        for i in range(1, self.n):
            self.paths.append((*self.paths[parents[i]], tokens[i]))
        self.depth = max(len(p) for p in self.paths)

    def links(self) -> tuple[list[int], list[int]]:
        first, sibling = [-1] * self.n, [-1] * self.n
        for i in range(self.n - 1, 0, -1):  # children in index order
            sibling[i], first[self.parents[i]] = first[self.parents[i]], i
        return first, sibling


def make_tree(shape: str, ctx: tuple[int, ...], target: Target, pad: int = 0) -> Tree:
    """Tokens drawn like a decent drafter would (mostly likely tokens, distinct among
    siblings); ``pad`` extra token-0 leaves under the root, as the drafters pad."""
    rng = random.Random(repr((shape, ctx)))  # str seeds hash deterministically
    n = {"chain": 5, "star": 6, "random": 9, "padded": 5}[shape]
    parents = [-1] + (
        list(range(n - 1))
        if shape == "chain"
        else [0] * (n - 1)
        if shape == "star"
        else [rng.randrange(i) for i in range(1, n)]
    )
    tokens = [0] * n
    for i in range(1, n):
        taken = {tokens[j] for j in range(1, i) if parents[j] == parents[i]}
        free = [t for t in range(VOCAB) if t not in taken]
        path = Tree(parents[:i], tokens[:i]).paths[parents[i]]
        p = target.probs(ctx + path)[free] ** 2 + 0.01
        tokens[i] = rng.choices(free, weights=p.tolist())[0]
    return Tree(parents + [0] * pad, tokens + [0] * pad)


def target_rows(tree: Tree, ctx: tuple[int, ...], target: Target) -> torch.Tensor:
    return torch.stack([target.probs(ctx + p) for p in tree.paths])


# -- running a verifier -------------------------------------------------------------------


def run(verifier: Verifier, tree: Tree, rows: torch.Tensor, bs: int, g, steps: int, **kw):
    """One verify of ``bs`` identical requests; returns (committed tokens [bs, steps]
    with -1 past the end, number of accepted drafts [bs], last accepted node [bs])."""
    n = tree.n
    first, sibling = tree.links()
    index = torch.arange(bs * n).view(bs, n)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
    predicts, num = torch.zeros(bs * n, dtype=torch.int32), torch.zeros(bs, dtype=torch.int32)
    verifier(
        predicts,
        accept_index,
        num,
        torch.tensor(tree.tokens).expand(bs, n).contiguous(),
        index,
        torch.tensor(first).expand(bs, n).contiguous(),
        torch.tensor(sibling).expand(bs, n).contiguous(),
        torch.rand(bs, n, generator=g),
        torch.rand(bs, generator=g),
        rows.expand(bs, n, VOCAB).contiguous(),
        torch.zeros(bs, n, VOCAB),
        **kw,
    )
    num = num.long()
    taken = torch.arange(steps) <= num[:, None]
    committed = torch.where(taken, predicts.long()[accept_index.long().clamp_min(0)], -1)
    last = accept_index.long().gather(1, num[:, None]).squeeze(1) - torch.arange(bs) * n
    return committed, num, last


def first_two(verifier: Verifier, shape: str, target: Target, trials: int, seed: int, **kw):
    """The first two committed tokens of ``trials`` requests after context ``(1,)``."""
    g, ctx = torch.Generator().manual_seed(seed), (1,)
    pad = 3 if shape == "padded" else 0
    tree = make_tree(shape, ctx, target, pad)
    committed, num, _ = run(verifier, tree, target_rows(tree, ctx, target), trials, g, 4, **kw)
    x1, x2 = committed[:, 0], committed[:, 1].clone()
    for t in x1[num == 0].unique().tolist():  # a second step, rooted at the bonus token
        sel = (num == 0) & (x1 == t)
        nxt = make_tree(shape, (*ctx, t), target, pad)
        rows = target_rows(nxt, (*ctx, t), target)
        x2[sel] = run(verifier, nxt, rows, int(sel.sum()), g, 4, **kw)[0][:, 0]
    return x1, x2


def chi_square_p(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson goodness of fit; cells expecting fewer than 5 are pooled. An
    observation in a cell of probability 0 gives p = 0."""
    observed, expected = observed.double().flatten(), expected.double().flatten()
    if bool((observed[expected == 0] > 0).any()):
        return 0.0
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    return float(torch.special.gammaincc(torch.tensor((len(exp) - 1) / 2), stat / 2))


def joint_p(verifier: Verifier, shape: str, seed: int = 0, trials: int = TRIALS, **kw) -> float:
    target = Target(seed)
    x1, x2 = first_two(verifier, shape, target, trials, seed, **kw)
    counts = torch.bincount(x1 * VOCAB + x2, minlength=VOCAB * VOCAB).view(VOCAB, VOCAB)
    p1 = target.probs((1,)).double()
    p2 = torch.stack([target.probs((1, t)).double() for t in range(VOCAB)])
    return chi_square_p(counts, trials * p1[:, None] * p2)


# -- the biased verifiers of the negative controls ----------------------------------------


def literal_kernel(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
    draft_probs, threshold_single=1.0, threshold_acc=1.0, *, residual=True,
):  # fmt: skip
    """The host's CUDA kernel transcribed line by line, one request at a time, in
    float32 (repeated sibling tokens count again, as there). ``residual=False`` is a
    bug: the bonus token ignores the rejected drafts."""
    bs, n = candidates.shape
    steps, vocab = accept_index.shape[1], target_probs.shape[-1]
    cand, idx = candidates.tolist(), retrive_index.tolist()
    nxt, sib = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    coins, final = uniform_samples.numpy(), uniform_samples_for_final_sampling.numpy()
    probs, draft = target_probs.numpy(), draft_probs.numpy()
    th_acc, th_single = np.float32(max(threshold_acc, 1e-9)), np.float32(threshold_single)
    for b in range(bs):
        acc, row, coin, last, num, cur = np.float32(0), 0, coins[b, 0], idx[b][0], 0, 0
        accept_index[b, 0] = last
        for _ in range(1, steps):
            cur = nxt[b][cur]
            while cur != -1:
                tok = cand[b][cur]
                p = probs[b, row, tok]
                acc = np.float32(acc + p)
                if p > 0 and (coin < acc / th_acc or p >= th_single):
                    acc, row, coin = np.float32(0), cur, coins[b, cur]
                    predicts[last] = tok
                    num += 1
                    accept_index[b, num] = last = idx[b][cur]
                    break
                draft[b, row, tok] = p
                cur = sib[b][cur]
            if cur == -1:
                break
        accept_token_num[b] = num
        use_draft = residual and num != steps - 1
        relu = (target_probs[b, row] - (draft_probs[b, row] if use_draft else 0)).clamp_min(0)
        cdf = relu.cumsum(-1)
        above = ((cdf > torch.tensor(final[b]) * cdf[-1]) & (relu > 0)).nonzero()
        valid = (relu > 0).nonzero()
        predicts[last] = (
            int(above[0]) if len(above) else int(valid[-1]) if len(valid) else vocab - 1
        )


def greedy(predicts, accept_index, num, cand, idx, nxt, sib, coins, final, probs, draft, **kw):
    """What the host does on CPU without our fallback: greedy verify."""
    ops.verify_tree_greedy_cpu(predicts, accept_index, num, cand, idx, nxt, sib, probs.argmax(-1))


# -- distribution tests -------------------------------------------------------------------

SHAPES = ["chain", "star", "random", "padded"]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES)
def test_first_two_tokens_follow_the_target(shape, seed):
    p = joint_p(tree_speculative_sampling_target_only, shape, seed)
    print(f"{shape} seed {seed}: joint chi-square p = {p:.3g}")
    assert p > PASS_P


@pytest.mark.parametrize("shape", ["chain", "star", "random"])
@pytest.mark.parametrize("steps", [2, 4, 6])
def test_accept_length_and_last_node_follow_the_target(shape, steps):
    target, ctx = Target(7, sharpness=3.0), (3,)
    tree = make_tree(shape, ctx, target)
    g = torch.Generator().manual_seed(steps)
    rows = target_rows(tree, ctx, target)
    _, num, last = run(tree_speculative_sampling_target_only, tree, rows, TRIALS, g, steps)
    first, sibling = tree.links()
    reach, expected = [1.0] + [0.0] * (tree.n - 1), torch.zeros(tree.n, dtype=torch.float64)
    for v in range(tree.n):  # exact: a child is accepted with its target probability
        kids = [c for c in range(v + 1, tree.n) if tree.parents[c] == v]
        if len(tree.paths[v]) >= steps - 1:
            expected[v] = reach[v]
            continue
        for c in kids:
            reach[c] = reach[v] * float(rows[v, tree.tokens[c]])
        expected[v] = reach[v] * (1 - sum(float(rows[v, tree.tokens[c]]) for c in kids))
    assert torch.equal(num, torch.tensor([len(tree.paths[v]) for v in last.tolist()]))
    p = chi_square_p(torch.bincount(last, minlength=tree.n), TRIALS * expected)
    print(f"{shape} steps {steps}: mean accepted {num.float().mean():.2f}, p = {p:.3g}")
    assert p > PASS_P


NEGATIVE_CONTROLS = {
    "greedy verify (the host on CPU)": (greedy, {}),
    "drafts accepted with probability 1 (threshold_single=0)": (
        tree_speculative_sampling_target_only,
        {"threshold_single": 0.0},
    ),
    "lenient acceptance (threshold_acc=0.5)": (
        tree_speculative_sampling_target_only,
        {"threshold_acc": 0.5},
    ),
    "bonus ignores the rejected drafts": (literal_kernel, {"residual": False}),
    "repeated padding tokens counted again (literal kernel)": (literal_kernel, {}),
}


@pytest.mark.parametrize("name", list(NEGATIVE_CONTROLS))
def test_negative_controls_are_detected(name):
    verifier, kw = NEGATIVE_CONTROLS[name]
    shape = "padded" if "padding" in name else "star"
    p = joint_p(verifier, shape, seed=0, trials=6000, **kw)
    print(f"{name}: p = {p:.3g}")
    assert p < DETECT_P


def test_matches_the_literal_kernel_on_distinct_siblings():
    """Same coins, same outputs (accepted path, counts, every written token) as the
    kernel transcription, thresholds included, wherever sibling tokens differ."""
    rng = random.Random(5)
    for case in range(24):
        target, ctx = Target(100 + case, sharpness=3.0), (case,)
        tree = make_tree(rng.choice(["chain", "star", "random"]), ctx, target)
        rows, steps = target_rows(tree, ctx, target), rng.randint(1, tree.depth + 2)
        kw = {"threshold_single": rng.choice([1.0, 0.6]), "threshold_acc": rng.choice([1.0, 0.7])}
        got = run(tree_speculative_sampling_target_only, tree, rows, 64, torch.Generator().manual_seed(case), steps, **kw)  # fmt: skip
        want = run(literal_kernel, tree, rows, 64, torch.Generator().manual_seed(case), steps, **kw)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b), (case, kw)


def test_draft_probs_record_rejected_drafts_and_empty_batch():
    target, ctx = Target(3), (2,)
    tree = make_tree("star", ctx, target)
    rows = target_rows(tree, ctx, target)
    first, sibling = tree.links()
    draft = torch.zeros(1, tree.n, VOCAB)
    args = [torch.zeros(tree.n, dtype=torch.int32), torch.full((1, 2), -1, dtype=torch.int32)]
    args += [
        torch.zeros(1, dtype=torch.int32),
        torch.tensor([tree.tokens]),
        torch.arange(tree.n)[None],
    ]
    args += [torch.tensor([first]), torch.tensor([sibling]), torch.ones(1, tree.n) * 0.999999]
    tree_speculative_sampling_target_only(*args, torch.zeros(1), rows[None], draft)
    kids = [tree.tokens[c] for c in range(1, tree.n)]
    assert int(args[2]) == 0  # a coin near 1 rejects every draft ...
    assert torch.equal(draft[0, 0, kids], rows[0, kids])  # ... and records each of them
    assert int(args[0][0]) not in kids and rows[0, int(args[0][0])] > 0  # bonus from the rest
    empty = [torch.zeros(0, dtype=torch.int32), torch.zeros(0, 3, dtype=torch.int32)]
    empty += [torch.zeros(0, dtype=torch.int32)] + [torch.zeros(0, 4, dtype=torch.int64)] * 4
    tree_speculative_sampling_target_only(*empty, torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, 4, 5), torch.zeros(0, 4, 5))  # fmt: skip


# -- temperature, top-k, top-p as the host's verify applies them ------------------------------


def test_top_k_and_top_p_renorm_against_loops():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(6, 11, generator=g) * 2, -1)
    ks = torch.tensor([1, 3, 11, TOP_K_ALL, 5, 0])
    ps = torch.tensor([0.0, 0.3, 0.5, 0.9, 0.999, 1.0])
    got_k, got_p = top_k_renorm_prob(probs, ks), top_p_renorm_prob(probs, ps)
    for r in range(6):
        order = probs[r].argsort(descending=True, stable=True).tolist()
        k = 11 if int(ks[r]) in (0, TOP_K_ALL) else int(ks[r])
        keep_k, keep_p, mass = set(order[:k]), set(), 0.0
        for t in order:  # the host torch sampler's rule: preceding mass <= top_p
            if mass <= float(ps[r]):
                keep_p.add(t)
            mass += float(probs[r, t])
        for got, keep in ((got_k, keep_k), (got_p, keep_p)):
            want = torch.tensor([float(probs[r, t]) if t in keep else 0.0 for t in range(11)])
            torch.testing.assert_close(got[r], want / want.sum())
    torch.testing.assert_close(
        top_k_renorm_prob(probs, 2), top_k_renorm_prob(probs, torch.tensor([2] * 6))
    )
    torch.testing.assert_close(top_p_renorm_prob(probs, 1.0), probs)


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(0.7, TOP_K_ALL, 1.0), (1.3, 3, 1.0), (1.0, TOP_K_ALL, 0.8), (0.8, 4, 0.9)]
)  # fmt: skip
def test_temperature_top_k_top_p_follow_the_filtered_target(temperature, top_k, top_p):
    """Target rows processed like eagle_sample does (softmax of logits / T, then
    top-k renorm, then top-p renorm); committed tokens follow that distribution.
    With top-k or top-p alone this is the host CPU sampler's distribution; with
    both, the host's verify filters top-p after top-k renormalisation (its sampler
    filters them jointly)."""
    base = Target(11, sharpness=2.0)

    class Filtered(Target):
        def probs(self, ctx):
            rows = torch.softmax(base.logits(ctx).float()[None] / temperature, -1)
            return top_p_renorm_prob(top_k_renorm_prob(rows, top_k), top_p)[0]

    target = Filtered(11)
    ctx = (1,)
    x1, x2 = first_two(tree_speculative_sampling_target_only, "random", target, TRIALS, 1)
    counts = torch.bincount(x1 * VOCAB + x2, minlength=VOCAB * VOCAB).view(VOCAB, VOCAB)
    p2 = torch.stack([target.probs((*ctx, t)).double() for t in range(VOCAB)])
    expected = TRIALS * target.probs(ctx).double()[:, None] * p2
    p = chi_square_p(counts, expected)
    print(f"T={temperature} top_k={top_k} top_p={top_p}: p = {p:.3g}")
    assert p > PASS_P
    if top_k < VOCAB:  # a filtered-out token is never committed
        assert int(counts[expected == 0].sum()) == 0 and bool((expected == 0).any())
