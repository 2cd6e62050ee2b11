"""The pure-torch GDN kernel fallbacks against direct (loop) definitions.

The delta rule's reference is the textbook matrix form ``S_t = a_t (I - b_t k_t k_t^T)
S_{t-1} + b_t k_t v_t^T``, ``o_t = S_t^T q_t`` (``S`` is ``[K, V]``; ``a_t = exp(g_t)``), one
request, one head and one token at a time; the conv's is the sum over each token's
``W``-wide window written out. Tree drafts come from random parent lists, turned into the
host's first-child / next-sibling links.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from sglang_spec_ext.sglang.cpu.fallbacks import gdn_ops, layer_gates

H, HV, K, V, W, DIM = 2, 4, 8, 6, 4, 10
SHAPES = ("chain", "star", "random")


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def parents_of(shape: str, n: int, rng: random.Random) -> list[int]:
    if shape == "chain":
        return [0] + list(range(n - 1))
    if shape == "star":
        return [0] * n
    return [0] + [rng.randrange(i) for i in range(1, n)]


def links(parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The host's retrieve_next_token / retrieve_next_sibling of a parent list."""
    n = len(parents)
    nxt, sib = [-1] * n, [-1] * n
    for p in range(n):
        kids = [c for c in range(1, n) if parents[c] == p]
        if kids:
            nxt[p] = kids[0]
        for a, b in zip(kids, kids[1:], strict=False):
            sib[a] = b
    return torch.tensor(nxt), torch.tensor(sib)


def path(parents: list[int], t: int) -> list[int]:
    out = [t]
    while out[-1] != 0:
        out.append(parents[out[-1]])
    return out[::-1]


# -- the delta rule, directly ------------------------------------------------------------
def ref_gate(A_log, a, dt_bias):  # noqa: N803 (the host's names)
    x = a + dt_bias
    return -torch.exp(A_log) * torch.log(1 + torch.exp(x)), x


def ref_delta(S, q, k, v, a, b, A_log, dt_bias):  # noqa: N803
    """One request: S [HV, K, V] float64, tokens q/k [T, H, K], v [T, HV, V], a/b [T, HV]."""
    S = S.clone().double()
    outs, states = [], []
    for t in range(q.shape[0]):
        o_t = torch.zeros(HV, V, dtype=torch.float64)
        for h in range(HV):
            kh, qh = k[t, h // (HV // H)].double(), q[t, h // (HV // H)].double()
            kh = kh / torch.sqrt((kh * kh).sum() + 1e-6)
            qh = qh / torch.sqrt((qh * qh).sum() + 1e-6) * K**-0.5
            g = -torch.exp(A_log[h].double()) * F.softplus(a[t, h].double() + dt_bias[h].double())
            beta = torch.sigmoid(b[t, h].double())
            eye = torch.eye(K, dtype=torch.float64)
            S[h] = torch.exp(g) * (eye - beta * torch.outer(kh, kh)) @ S[h] + beta * torch.outer(
                kh, v[t, h].double()
            )
            o_t[h] = S[h].T @ qh
        outs.append(o_t)
        states.append(S.clone())
    return torch.stack(outs), states


def params(seed: int):
    return rand(HV, seed=seed), rand(HV, seed=seed + 1)  # A_log, dt_bias


def tokens(n: int, seed: int):
    return (rand(n, H, K, seed=seed), rand(n, H, K, seed=seed + 1), rand(n, HV, V, seed=seed + 2),
            rand(n, HV, seed=seed + 3), rand(n, HV, seed=seed + 4))  # fmt: skip


def pool_of(slots: int, seed: int) -> torch.Tensor:
    """A state pool [slots, HV, V, K] (the host's layout: the math's S transposed)."""
    return rand(slots, HV, V, K, seed=seed) * 0.3


def as_math(state: torch.Tensor) -> torch.Tensor:
    return state.transpose(-1, -2).double()


def test_gating_matches_the_formula():
    A_log, dt_bias = params(1)
    a, b = rand(5, HV, seed=3), rand(5, HV, seed=4) * 30  # softplus's threshold branch too
    g, beta = gdn_ops.fused_gdn_gating_cpu(A_log, a * 30, b, dt_bias)
    for t in range(5):
        for h in range(HV):
            x = float(a[t, h] * 30 + dt_bias[h])
            sp = x if x > 20 else float(torch.log1p(torch.exp(torch.tensor(x))))
            assert g[0, t, h].item() == pytest.approx(-float(torch.exp(A_log[h])) * sp, rel=1e-5)
            assert beta[0, t, h].item() == pytest.approx(float(torch.sigmoid(b[t, h])), rel=1e-6)


@pytest.mark.parametrize("lens", [(5,), (1, 7, 3)])
def test_prefill_and_decode_follow_the_delta_rule(lens):
    """The chunk (prefill) op over varlen sequences from their slots' states, then decode
    steps (the fused update) on the same slots: outputs and final states of the reference."""
    A_log, dt_bias = params(7)
    pool = pool_of(6, 9)
    slots = torch.tensor([4, 1, 3][: len(lens)])
    start = pool.clone()
    q, k, v, a, b = tokens(sum(lens), 11)
    g, beta = gdn_ops.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    o, _, _ = gdn_ops.chunk_gated_delta_rule_cpu(
        q[None], k[None], v[None], g, beta, initial_state=pool, cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True, initial_state_indices=slots,
    )  # fmt: skip
    dq, dk, dv, da, db = tokens(len(lens), 21)  # one decode token per request
    od = gdn_ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=dq[None], k=dk[None], v=dv[None], a=da, b=db,
        initial_state_source=pool, initial_state_indices=slots,
        cu_seqlens=torch.arange(len(lens) + 1), use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    for n, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        cat = [torch.cat([x[lo:hi], y[n : n + 1]]) for x, y in
               zip((q, k, v, a, b), (dq, dk, dv, da, db), strict=True)]  # fmt: skip
        want, states = ref_delta(as_math(start[slots[n]]), *cat, A_log, dt_bias)
        torch.testing.assert_close(o[0, lo:hi].double(), want[:-1], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(od[0, n].double(), want[-1], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(as_math(pool[slots[n]]), states[-1], rtol=1e-4, atol=1e-5)
    untouched = [s for s in range(6) if s not in slots.tolist()]
    torch.testing.assert_close(pool[untouched], start[untouched])


@pytest.mark.parametrize("shape", SHAPES)
def test_tree_verify_keeps_each_nodes_state_and_leaves_the_pool(shape):
    """Target verify of a tree draft per request: node t's output and its scratch state are
    the reference's along the root-to-t path; the pool is untouched (the commit writes it)."""
    rng = random.Random(5)
    A_log, dt_bias = params(2)
    steps, bs = 6, 2
    pool = pool_of(5, 3)
    start = pool.clone()
    slots, rows = torch.tensor([3, 0]), torch.tensor([1, 0])
    parents = [parents_of(shape, steps, rng) for _ in range(bs)]
    q, k, v, a, b = tokens(bs * steps, 31)
    buffer = torch.zeros(3, steps, HV, V, K)
    parent_out = torch.zeros(bs, steps, dtype=torch.int64)
    nxt, sib = zip(*(links(p) for p in parents), strict=True)
    # the conv update derives the parents the recurrent update reads
    gdn_ops.causal_conv1d_update_cpu(
        rand(bs, DIM, steps, seed=1), torch.zeros(4, DIM, W - 1), rand(DIM, W, seed=2),
        conv_state_indices=slots, retrieve_next_token=torch.stack(nxt),
        retrieve_next_sibling=torch.stack(sib), retrieve_parent_token=parent_out,
    )  # fmt: skip
    assert parent_out.tolist() == parents
    out = gdn_ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=q[None], k=k[None], v=v[None], a=a, b=b,
        initial_state_source=pool, initial_state_indices=slots,
        cu_seqlens=torch.arange(0, bs * steps + 1, steps), use_qk_l2norm_in_kernel=True,
        disable_state_update=True, intermediate_states_buffer=buffer,
        intermediate_state_indices=rows, cache_steps=steps, retrieve_parent_token=parent_out,
    )  # fmt: skip
    torch.testing.assert_close(pool, start)
    for n in range(bs):
        for t in range(steps):
            idx = [n * steps + i for i in path(parents[n], t)]
            want, states = ref_delta(as_math(start[slots[n]]), q[idx], k[idx], v[idx], a[idx],
                                     b[idx], A_log, dt_bias)  # fmt: skip
            torch.testing.assert_close(
                out[0, n * steps + t].double(), want[-1], rtol=1e-4, atol=1e-5
            )
            torch.testing.assert_close(
                as_math(buffer[rows[n], t]), states[-1], rtol=1e-4, atol=1e-5
            )


# -- the causal conv1d, directly ---------------------------------------------------------
def ref_conv(history: list[torch.Tensor], weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """silu(sum_j weight[:, j] * window[j] + bias) over the last W inputs (oldest first)."""
    acc = bias.clone()
    for j, x in enumerate(history[-W:]):
        acc = acc + weight[:, j] * x
    return acc * torch.sigmoid(acc)


@pytest.mark.parametrize("initial", [False, True])
def test_conv_prefill_matches_the_window_sum(initial):
    weight, bias = rand(DIM, W, seed=1), rand(DIM, seed=2)
    lens, slots = [5, 2], torch.tensor([2, 0])
    states = rand(3, DIM, W - 1, seed=3)
    start = states.clone()
    x = rand(DIM, sum(lens), seed=4)
    out = gdn_ops.causal_conv1d_fn_cpu(
        x, weight, bias, states, torch.tensor([0, 5, 7]), lens, cache_indices=slots,
        has_initial_state=torch.tensor([initial, initial]), activation="silu",
    )  # fmt: skip
    for n, (lo, hi) in enumerate([(0, 5), (5, 7)]):
        prev = start[slots[n]] if initial else torch.zeros(DIM, W - 1)
        hist = [prev[:, j] for j in range(W - 1)]
        for t in range(lo, hi):
            hist.append(x[:, t])
            torch.testing.assert_close(
                out[:, t], ref_conv(hist, weight, bias), rtol=1e-5, atol=1e-6
            )
        torch.testing.assert_close(states[slots[n]], torch.stack(hist[-(W - 1) :], dim=1))
    torch.testing.assert_close(states[1], start[1])


@pytest.mark.parametrize("shape", SHAPES)
def test_conv_update_windows_follow_the_tree(shape):
    """Verify: each node convolves its own ancestors (then the state); its scratch window
    is its last W - 1 inputs; a chain of decode steps gives the same as one chain verify."""
    rng = random.Random(3)
    weight, bias = rand(DIM, W, seed=5), rand(DIM, seed=6)
    steps, slots, rows = 7, torch.tensor([1, 2]), torch.tensor([0, 1])
    states = rand(3, DIM, W - 1, seed=7)
    start = states.clone()
    parents = [parents_of(shape, steps, rng) for _ in range(2)]
    nxt, sib = zip(*(links(p) for p in parents), strict=True)
    x = rand(2, DIM, steps, seed=8)
    windows = torch.zeros(2, steps, DIM, W - 1)
    out = gdn_ops.causal_conv1d_update_cpu(
        x, states, weight, bias, "silu", conv_state_indices=slots,
        intermediate_conv_window=windows, intermediate_state_indices=rows,
        retrieve_next_token=torch.stack(nxt), retrieve_next_sibling=torch.stack(sib),
        retrieve_parent_token=torch.zeros(2, steps, dtype=torch.int64),
    )  # fmt: skip
    for n in range(2):
        prev = [start[slots[n]][:, j] for j in range(W - 1)]
        for t in range(steps):
            hist = prev + [x[n, :, i] for i in path(parents[n], t)]
            torch.testing.assert_close(
                out[n, :, t], ref_conv(hist, weight, bias), rtol=1e-5, atol=1e-6
            )
            torch.testing.assert_close(windows[rows[n], t], torch.stack(hist[-(W - 1) :], dim=1))


def test_conv_decode_steps_equal_a_chain_verify():
    weight, bias = rand(DIM, W, seed=9), rand(DIM, seed=10)
    states = rand(2, DIM, W - 1, seed=11)
    chain = states.clone()
    x = rand(1, DIM, 5, seed=12)
    idx = torch.tensor([1])
    steps = [gdn_ops.causal_conv1d_update_cpu(x[:, :, t], states, weight, bias, True,
                                              conv_state_indices=idx) for t in range(5)]  # fmt: skip
    verify = gdn_ops.causal_conv1d_update_cpu(x, chain, weight, bias, True, conv_state_indices=idx)
    torch.testing.assert_close(torch.stack(steps, dim=-1), verify)
    torch.testing.assert_close(states, chain)


# -- the commit and the layer gates -------------------------------------------------------
def test_state_scatter_writes_each_accepted_step():
    dst = rand(2, 5, 3, seed=1)
    src = rand(2, 4, 6, 3, seed=2)
    want = dst.clone()
    dst_idx, steps = torch.tensor([3, 0, 4, 1]), torch.tensor([2, -1, 5, 0])
    gdn_ops.mamba_state_scatter_with_mask(dst, src, dst_idx, steps)
    for i in range(4):
        if steps[i] >= 0:
            want[:, dst_idx[i]] = src[:, i, steps[i]]
    torch.testing.assert_close(dst, want)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_rms_norm_gated(activation):
    x, g, w = rand(3, 2, 8, seed=1), rand(3, 2, 8, seed=2), rand(8, seed=3)
    y = layer_gates.rms_norm_gated_cpu(x, g, w, None, activation, eps=1e-6)
    for i in range(3):
        for j in range(2):
            row = x[i, j] / torch.sqrt((x[i, j] ** 2).mean() + 1e-6) * w
            gate = (
                g[i, j] * torch.sigmoid(g[i, j]) if activation == "silu" else torch.sigmoid(g[i, j])
            )
            torch.testing.assert_close(y[i, j], row * gate)


@pytest.mark.parametrize("do_add", [False, True])
def test_shared_expert_gate(do_add):
    h, w, s = rand(4, 8, seed=1), rand(8, seed=2), rand(4, 8, seed=3)
    out = rand(4, 8, seed=4)
    want = out.clone()
    layer_gates.gate_sigmoid_mul_hook(None, h, w, s, out, do_add=do_add)
    for t in range(4):
        gate = torch.sigmoid(sum(h[t, i] * w[i] for i in range(8)))
        want[t] = gate * s[t] + (want[t] if do_add else 0)
    torch.testing.assert_close(out, want)
