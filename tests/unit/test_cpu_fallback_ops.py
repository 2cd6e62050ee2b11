"""The pure-torch CPU kernel fallbacks against straightforward loop references."""

from __future__ import annotations

import math
import random

import pytest
import torch

from sglang_spec_ext.sglang.cpu.fallbacks import ops
from sglang_spec_ext.sglang.cpu.fallbacks.verify_attention import draft_masks, tree_verify_attention

BATCHES = (1, 2, 7, 32)
SHAPES = ("chain", "star", "random")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_parents(shape: str, n: int, rng: random.Random) -> list[int]:
    """parent[i] < i for i >= 1; parent[0] = -1."""
    if shape == "chain":
        return [-1] + list(range(n - 1))
    if shape == "star":
        return [-1] + [0] * (n - 1)
    return [-1] + [rng.randrange(i) for i in range(1, n)]


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """Row i marks i and its ancestors (the NGRAM tree mask)."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


# -- KV copy and cache locations ------------------------------------------------------------


@pytest.mark.parametrize("num_locs", [1, 5, 64])
def test_copy_all_layer_kv_cache(num_locs):
    g = gen(num_locs)
    buffers = [
        torch.randn(80, 2, 4, generator=g),
        torch.randn(80, 3, generator=g).half(),
        torch.randint(0, 100, (80, 6), generator=g, dtype=torch.int32),
    ]
    perm = torch.randperm(80, generator=g)
    tgt, src = perm[:num_locs], torch.randint(0, 80, (num_locs,), generator=g)
    expected = [b.clone() for b in buffers]
    for k in range(num_locs):  # all reads see the original contents
        for e, b in zip(expected, buffers, strict=True):
            e[tgt[k]] = b[src[k]]
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in buffers])
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for e, b in zip(expected, buffers, strict=True):
        assert torch.equal(e, b)


def test_copy_all_layer_kv_cache_overlapping_move_and_noop():
    buf = torch.arange(10.0).repeat_interleave(3).view(10, 3)
    ptrs = torch.tensor([buf.data_ptr()], dtype=torch.uint64)
    strides = torch.tensor([12])
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2]))
    assert buf[:, 0].tolist() == [0, 0, 1, 2, 4, 5, 6, 7, 8, 9]
    ops.copy_all_layer_kv_cache_cpu(
        ptrs, strides, torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64)
    )
    with pytest.raises(ValueError):
        ops.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([-1]), torch.tensor([0]))


def test_kv_move_views_come_in_few_lengths():
    # ctypes keeps every array type it makes, by length, for the process's life: the byte
    # views are sized to powers of two, so spans 513..1024 share one length.
    buf = torch.zeros(1024, 4)
    lengths = {ops._byte_rows(buf.data_ptr(), 16, rows).shape[0] for rows in range(513, 1025)}
    assert lengths == {1024}
    assert ops._byte_rows(buf.data_ptr(), 16, 1).shape == (1, 16)
    view = ops._byte_rows(buf.data_ptr(), 16, 600)
    view[599] = 7  # the rows asked for are the buffer's own
    assert buf[599].view(torch.uint8).eq(7).all()


def ragged_case(bs: int, seed: int):
    g = gen(seed)
    pool_len = 40
    table = torch.randint(0, 10_000, (bs + 3, pool_len), generator=g, dtype=torch.int32)
    reqs = torch.randperm(bs + 3, generator=g)[:bs]
    start = torch.randint(0, 20, (bs,), generator=g)
    end = start + torch.randint(0, 12, (bs,), generator=g)
    return table, reqs, start, end, pool_len


@pytest.mark.parametrize("bs", BATCHES)
def test_assign_req_to_token_pool_and_extend_cache_locs(bs):
    table, reqs, start, end, pool_len = ragged_case(bs, bs)
    cells = [(int(reqs[b]), c) for b in range(bs) for c in range(int(start[b]), int(end[b]))]
    locs = torch.randint(0, 10_000, (len(cells) + 4,), generator=gen(1))
    expected = table.clone()
    for k, (row, col) in enumerate(cells):
        expected[row, col] = locs[k]
    ops.assign_req_to_token_pool_cpu(reqs, table, start, end, locs, pool_len)
    assert torch.equal(table, expected)
    table[reqs] = torch.randint(0, 10_000, (bs, pool_len), generator=gen(2), dtype=torch.int32)
    out = torch.full((len(cells) + 3,), -7, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(reqs, table, start, end, out, pool_len)
    assert out.tolist() == [int(table[row, col]) for row, col in cells] + [-7] * 3


@pytest.mark.parametrize("bs", BATCHES)
@pytest.mark.parametrize("topk, steps", [(1, 3), (4, 2)])
def test_assign_draft_cache_locs_contiguous(bs, topk, steps):
    table, reqs, start, _end, pool_len = ragged_case(bs, 200 + bs)
    width = topk * steps
    out = torch.full((bs * width + 2,), -1, dtype=torch.int64)
    expected = out.clone()
    for b in range(bs):
        for j in range(width):
            expected[b * width + j] = table[reqs[b], start[b] + j]
    ops.assign_draft_cache_locs_contiguous_cpu(reqs, table, start, out, pool_len, topk, steps)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("bs", BATCHES)
def test_fill_accept_out_cache_loc(bs):
    g = gen(bs)
    width = 5
    index = torch.full((bs, width), -1, dtype=torch.int32)
    for b in range(bs):
        k = int(torch.randint(1, width + 1, (1,), generator=g))
        index[b, :k] = torch.randperm(8, generator=g)[:k] + b * 8
    locs = torch.randint(0, 1000, (bs * 8,), generator=g)
    out = torch.zeros(bs * width, dtype=torch.int64)
    expected, dst = out.clone(), 0
    for p in index.flatten().tolist():
        if p != -1:
            expected[dst] = locs[p]
            dst += 1
    ops.fill_accept_out_cache_loc_cpu(index, locs, out)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("bs", BATCHES)
def test_fill_bonus_tokens(bs):
    g = gen(bs)
    stride = 6
    tokens = torch.randint(0, 500, (bs, stride), generator=g, dtype=torch.int32)
    lens = torch.randint(1, stride + 1, (bs,), generator=g, dtype=torch.int32)
    bonus = torch.full((bs + 1,), -1, dtype=torch.int64)
    expected = bonus.clone()
    for b in range(bs):
        expected[b] = tokens.flatten()[stride * b + lens[b] - 1]
    ops.fill_bonus_tokens_cpu(tokens, lens, bonus, stride)
    assert torch.equal(bonus, expected)


# -- trees --------------------------------------------------------------------------------


def reconstruct_reference(mask: torch.Tensor, seq_lens: torch.Tensor, bs: int, n: int):
    m = mask.view(bs, n, n).tolist()
    pos, nxt, sib = [], [], []
    for b in range(bs):
        for t in range(n):
            anc = [i for i in range(t) if m[b][t][i]]
            parent = max(anc) if anc else -1
            pos.append(len(anc) + int(seq_lens[b]))
            nxt.append(next((i for i in range(t + 1, n) if m[b][i][t]), -1))
            s = -1
            if parent != -1:
                for i in range(t + 1, n):
                    if m[b][i][parent] and not any(m[b][i][j] for j in range(parent + 1, i)):
                        s = i
                        break
            sib.append(s)
    return pos, nxt, sib


@pytest.mark.parametrize("bs", BATCHES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n", [1, 4, 8])
def test_reconstruct_indices_from_tree_mask(bs, shape, n):
    rng = random.Random(bs * 100 + n)
    mask = torch.stack([ancestor_mask(random_parents(shape, n, rng)) for _ in range(bs)])
    seq_lens = torch.randint(1, 50, (bs,), generator=gen(n))
    out = [torch.full((bs * n,), -9, dtype=torch.int64)] + [
        torch.full((bs, n), -9, dtype=torch.int64) for _ in range(3)
    ]
    ops.reconstruct_indices_from_tree_mask(mask.flatten(), seq_lens, *out, bs, n)
    pos, nxt, sib = reconstruct_reference(mask, seq_lens, bs, n)
    assert out[0].tolist() == pos
    assert out[1].flatten().tolist() == list(range(bs * n))
    assert out[2].flatten().tolist() == nxt
    assert out[3].flatten().tolist() == sib


def eagle_case(bs: int, topk: int, depth: int, n: int, seed: int):
    """Random top-k selections; parent tokens precede their block (acyclic)."""
    rng = random.Random(seed)
    cands = topk + (depth - 1) * topk * topk
    selected, parents = [], []
    for _ in range(bs):
        sel = sorted(rng.sample(range(cands), n - 1))
        par = [-1]
        for block in range(1, topk * (depth - 1) + 1):
            low = [c for c in sel if c < block * topk]
            pick = rng.random() < 0.85 and low
            par.append(rng.choice(low) if pick else rng.randrange(block * topk))
        selected.append(sel)
        parents.append(par)
    return torch.tensor(parents), torch.tensor(selected).view(bs, n - 1)


def build_tree_reference(parents, selected, seq_lens, mask, pos, idx, nxt, sib, topk, n, mode):
    bs = seq_lens.numel()
    width = 4 if n > 16 else (2 if n > 8 else 1)
    raw = mask.view(torch.uint8).view(-1) if mode == 2 else mask.view(-1)

    def find(b, token):
        return next((p for p in range(n - 1) if selected[b, p] == token), None)

    offset = 0
    for b in range(bs):
        sl = int(seq_lens[b])
        for tid in range(n):
            if mode == 0:
                row = offset + (sl + n) * tid + sl
            elif mode == 1:
                row = n * n * b + n * tid
            if mode == 2:
                raw[(b * n + tid) * width] = 1
            else:
                raw[row : row + n] = False
                raw[row] = True
            if tid == 0:
                pos[b * n] = sl
                continue
            cur, hops = tid - 1, 0
            while cur is not None:
                hops += 1
                if mode == 2:
                    raw[(b * n + tid) * width + (cur + 1) // 8] |= 1 << ((cur + 1) % 8)
                else:
                    raw[row + cur + 1] = True
                block = int(selected[b, cur]) // topk
                cur = None if block == 0 else find(b, parents[b, block])
            pos[b * n + tid] = sl + hops
        offset += n * n + sl * n
        for i in range(n - 1, 0, -1):
            idx[b, i] = b * n + i
            block = int(selected[b, i - 1]) // topk
            p = 0 if block == 0 else find(b, parents[b, block])
            if p is None:
                continue
            p = p + 1 if block else 0
            if nxt[b, p] != -1:
                sib[b, i] = nxt[b, p]
            nxt[b, p] = i
        idx[b, 0] = b * n


@pytest.mark.parametrize("bs", BATCHES)
@pytest.mark.parametrize("topk, depth, n", [(1, 4, 4), (2, 3, 5), (4, 4, 8), (3, 5, 12)])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("fill", [-1, "random"])
def test_build_tree_kernel_efficient(bs, topk, depth, n, mode, fill):
    parents, selected = eagle_case(bs, topk, depth, n, seed=bs * 31 + n + mode)
    g = gen(bs + n)
    seq_lens = torch.randint(1, 20, (bs,), generator=g)
    if mode == 0:
        mask = torch.ones(int(seq_lens.sum()) * n + bs * n * n, dtype=torch.bool)
    elif mode == 1:
        mask = torch.randint(0, 2, (bs * n * n + 3,), generator=g).bool()
    else:
        dtype = torch.int16 if n > 8 else torch.uint8  # bit-packed rows of 2 or 1 bytes
        mask = torch.randint(0, 100, (bs * n + 2,), generator=g).to(dtype)
    bufs = [torch.full((bs * n,), -5, dtype=torch.int64)]
    for _ in range(3):
        random_init = torch.randint(-1, n, (bs, n), generator=g)
        bufs.append(random_init if fill == "random" else torch.full((bs, n), -1))
    expected = [mask.clone()] + [b.clone() for b in bufs]
    build_tree_reference(parents, selected, seq_lens, *expected, topk, n, mode)
    ops.build_tree_kernel_efficient_cpu(
        parents, selected, seq_lens, mask, *bufs, topk, depth, n, mode
    )
    assert torch.equal(mask, expected[0])
    for got, want in zip(bufs, expected[1:], strict=True):
        assert torch.equal(got, want)


def verify_reference(cand, idx, nxt, sib, target, steps):  # the CUDA kernel's loop
    bs, n = cand.shape
    predicts = [0] * (bs * n)
    accept = [[-1] * steps for _ in range(bs)]
    counts = []
    flat_target = target.flatten().tolist()
    for b in range(bs):
        last = int(idx[b, 0])
        accept[b][0] = last
        num, cur = 0, 0
        for _ in range(1, steps):
            cur = int(nxt[b, cur])
            while cur != -1:
                if int(cand[b, cur]) == flat_target[last]:
                    predicts[last] = flat_target[last]
                    num += 1
                    accept[b][num] = int(idx[b, cur])
                    last = int(idx[b, cur])
                    break
                cur = int(sib[b, cur])
            if cur == -1:
                break
        counts.append(num)
        predicts[last] = flat_target[last]
    return predicts, accept, counts


def run_verify(cand, idx, nxt, sib, target, steps):
    bs, n = cand.shape
    predicts = torch.zeros(bs * n, dtype=torch.int32)
    accept = torch.full((bs, steps), -1, dtype=torch.int32)
    counts = torch.empty(bs, dtype=torch.int32)
    kw = dict(retrive_index=idx, retrive_next_token=nxt, retrive_next_sibling=sib)
    ops.verify_tree_greedy_cpu(
        predicts=predicts, accept_index=accept, accept_token_num=counts, candidates=cand, **kw,
        target_predict=target,
    )  # fmt: skip
    return predicts.tolist(), accept.tolist(), counts.tolist()


@pytest.mark.parametrize("bs", BATCHES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n, steps", [(1, 1), (4, 4), (8, 5), (8, 8)])
def test_verify_tree_greedy(bs, shape, n, steps):
    rng = random.Random(bs * 7 + n + steps)
    mask = torch.stack([ancestor_mask(random_parents(shape, n, rng)) for _ in range(bs)])
    pos, idx, nxt, sib = torch.empty(bs * n, dtype=torch.int64), *torch.empty(3, bs, n).long()
    ops.reconstruct_indices_from_tree_mask(mask, torch.zeros(bs), pos, idx, nxt, sib, bs, n)
    g = gen(bs + n)
    cand = torch.randint(0, 3, (bs, n), generator=g)
    target = torch.randint(0, 3, (bs, n), generator=g)
    got = run_verify(cand, idx, nxt, sib, target, steps)
    assert got == verify_reference(cand, idx, nxt, sib, target, steps)


def test_verify_tree_greedy_accepts_a_matching_chain():
    cand, target = torch.tensor([[9, 1, 2, 3, 4]]), torch.tensor([[1, 2, 3, 4, 7]])
    idx, nxt, sib = torch.arange(5)[None], torch.tensor([[1, 2, 3, 4, -1]]), torch.full((1, 5), -1)
    predicts, accept, counts = run_verify(cand, idx, nxt, sib, target, 5)
    assert counts == [4] and accept == [[0, 1, 2, 3, 4]] and predicts == [1, 2, 3, 4, 7]


# -- tree verify attention ------------------------------------------------------------------


def attention_reference(
    q, k_cache, v_cache, prefix, drafts, visible, scale, window=None, qpos=None
):
    bs, n = drafts.shape
    heads, kv_heads = q.shape[1], k_cache.shape[1]
    out = torch.zeros(bs * n, heads, v_cache.shape[-1], dtype=torch.float64)
    for b in range(bs):
        p, slots = len(prefix[b]), prefix[b].tolist() + drafts[b].tolist()
        for i in range(n):
            low = -1 if window is None else int(qpos[b * n + i]) - window
            keys = [s for j, s in enumerate(slots[:p]) if j >= low]
            keys += [
                s
                for j, s in enumerate(slots[p:])
                if visible[b, i, j] and (window is None or int(qpos[b * n + j]) >= low)
            ]  # a draft key at its own position, windowed as the prefix's
            for h in range(heads):
                kh = h // (heads // kv_heads)
                logits = [
                    float(q[b * n + i, h].double() @ k_cache[s, kh].double()) * scale for s in keys
                ]
                weights = [math.exp(x - max(logits)) for x in logits]
                for w, s in zip(weights, keys, strict=True):
                    out[b * n + i, h] += w / sum(weights) * v_cache[s, kh].double()
    return out


@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (4, 2)])
def test_tree_verify_attention(bs, shape, heads, kv_heads):
    n, dim, rng, g = 4, 8, random.Random(bs), gen(bs)
    k_cache, v_cache = torch.randn(2, 64, kv_heads, dim, generator=g)
    slots = torch.randperm(64, generator=g)
    seq_lens = torch.randint(1, 9, (bs,), generator=g)
    prefix = [slots[10 * b : 10 * b + int(seq_lens[b])] for b in range(bs)]
    drafts = slots[40 : 40 + bs * n].view(bs, n)
    trees = [ancestor_mask(random_parents(shape, n, rng)) for _ in range(bs)]
    visible = draft_masks(torch.stack(trees).flatten(), seq_lens, n, chain=False)
    ones = [torch.ones(n, int(seq_lens[b]), dtype=torch.bool) for b in range(bs)]
    full = torch.cat([torch.cat([ones[b], trees[b]], 1).flatten() for b in range(bs)])
    assert torch.equal(draft_masks(full, seq_lens, n, chain=False), visible)
    q = torch.randn(bs * n, heads, dim, generator=g)
    args = (q, k_cache, v_cache, prefix, drafts, visible)
    got = tree_verify_attention(*args, scaling=0.3)
    torch.testing.assert_close(got.double(), attention_reference(*args, 0.3), rtol=1e-4, atol=1e-5)
    qpos = torch.cat([int(seq_lens[b]) + visible[b].sum(-1) - 1 for b in range(bs)])
    for window in (3, 1):  # 1: shorter than the drafts, whose first tokens fall out of it
        got = tree_verify_attention(*args, scaling=0.3, query_positions=qpos, sliding_window=window)
        want = attention_reference(*args, 0.3, window, qpos)
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    chain = draft_masks(None, seq_lens, n, chain=True)  # tree_topk == 1: causal drafts
    assert torch.equal(chain, torch.ones(n, n, dtype=torch.bool).tril().expand(bs, n, n))
