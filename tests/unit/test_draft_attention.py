"""Model-draft support on the CPU engine, piece by piece: the per-branch KV table of the
torch_native multi-step draft decode (against a plain loop reference), the draft
step backend's attention on real host objects (against SDPA over the expected
slots), and the one-step EAGLE tree (an empty parent list)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang_spec_ext.sglang.cpu.draft_attention import draft_decode_table
from sglang_spec_ext.sglang.cpu.fallbacks import ops


def table_reference(req_to_token, req_pool_indices, seq_lens, topk, num_steps):
    bs = len(seq_lens)
    width = max(seq_lens) + num_steps
    out = torch.zeros((bs * topk, width), dtype=req_to_token.dtype)
    for b in range(bs):
        row = req_to_token[req_pool_indices[b]]
        for t in range(topk):
            slots = [int(row[j]) for j in range(seq_lens[b])]
            start = seq_lens[b] + t * num_steps
            slots += [int(row[start + s]) for s in range(num_steps)]
            out[b * topk + t, : len(slots)] = torch.tensor(slots, dtype=req_to_token.dtype)
    return out


@pytest.mark.parametrize("bs", [1, 3, 8])
@pytest.mark.parametrize("topk, num_steps", [(1, 3), (2, 2), (4, 5), (3, 1)])
def test_draft_decode_table_matches_reference(bs, topk, num_steps):
    g = torch.Generator().manual_seed(bs * 7 + topk * 3 + num_steps)
    pool_rows, pool_len = 12, 64
    req_to_token = torch.randperm(pool_rows * pool_len, generator=g).view(pool_rows, pool_len)
    req_to_token = req_to_token.to(torch.int32)
    req_pool_indices = torch.randperm(pool_rows, generator=g)[:bs]
    seq_lens = torch.randint(1, pool_len - topk * num_steps, (bs,), generator=g)
    got = draft_decode_table(req_to_token, req_pool_indices, seq_lens, topk, num_steps)
    want = table_reference(
        req_to_token, req_pool_indices.tolist(), seq_lens.tolist(), topk, num_steps
    )
    assert got.dtype == req_to_token.dtype
    assert torch.equal(got, want)
    # The graph-safe form: the pool's row length, the same slots, zeros after them.
    fixed = draft_decode_table(req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len)
    assert fixed.shape == (bs * topk, pool_len)
    assert torch.equal(fixed[:, : want.shape[1]], want)
    assert not fixed[:, want.shape[1] :].any()


class _Pool:
    """The two attributes of the host's req_to_token / KV pools the backend reads
    (stand-ins: the real pools allocate through the model runner's device set-up)."""

    def __init__(self, req_to_token, k, v):
        self.req_to_token = req_to_token
        self.k, self.v = k, v

    def set_kv_buffer(self, layer, loc, k, v):
        self.k[loc.loc if hasattr(loc, "loc") else loc[0]] = k.view(-1, *self.k.shape[1:])
        self.v[loc.loc if hasattr(loc, "loc") else loc[0]] = v.view(-1, *self.v.shape[1:])

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


@pytest.mark.parametrize("graph_safe", [False, True], ids=["host-loop", "graph-safe"])
def test_multi_step_backend_attends_prefix_and_own_branch(graph_safe):
    """Real host TorchNativeAttnBackend underneath; the runner, pools and layer are
    minimal stand-ins (a real ModelRunner needs a loaded model). ``graph_safe`` is the
    form the CPU graph emulation captures (fixed-width table, masked attention)."""
    from types import SimpleNamespace

    from sglang_spec_ext.sglang.cpu.draft_attention import TorchNativeMultiStepDraftBackend

    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, slots = 4, 2, 8, 256
    req_to_token = torch.randperm(slots, generator=g)[:200].view(4, 50).to(torch.int32)
    pool = _Pool(req_to_token, torch.randn(slots, kv_heads, dim, generator=g),
                 torch.randn(slots, kv_heads, dim, generator=g))  # fmt: skip
    runner = SimpleNamespace(device="cpu", req_to_token_pool=pool, token_to_kv_pool=pool)
    topk, steps = 2, 3
    backend = TorchNativeMultiStepDraftBackend(runner, topk, steps, graph_safe=graph_safe)
    assert len(backend.attn_backends) == steps - 1
    req_pool_indices = torch.tensor([2, 0])
    seq_lens = torch.tensor([7, 12])
    batch = SimpleNamespace(req_pool_indices=req_pool_indices, seq_lens=seq_lens,
                            out_cache_loc=None, encoder_lens=None)  # fmt: skip
    backend.init_forward_metadata(batch)
    layer = SimpleNamespace(tp_q_head_num=heads, tp_k_head_num=kv_heads, qk_head_dim=dim,
                            v_head_dim=dim, layer_id=0, scaling=dim**-0.5,
                            is_cross_attention=False, sliding_window_size=-1)  # fmt: skip
    for step, step_backend in enumerate(backend.attn_backends):
        q = torch.randn(2 * topk, heads * dim, generator=g)
        k = torch.randn(2 * topk, kv_heads * dim, generator=g)
        v = torch.randn(2 * topk, kv_heads * dim, generator=g)
        # this step's slot of every (request, branch), as the host's draft worker lays it out
        loc = torch.tensor([int(req_to_token[r, s + t * steps + step])
                            for r, s in zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
                            for t in range(topk)])  # fmt: skip
        batch.out_cache_loc = loc
        out = step_backend.forward_decode(q, k, v, layer, batch)
        for row in range(2 * topk):
            b, t = divmod(row, topk)
            r, s = int(req_pool_indices[b]), int(seq_lens[b])
            seen = req_to_token[r, :s].tolist()
            seen += [int(req_to_token[r, s + t * steps + i]) for i in range(step + 1)]
            keys = pool.k[seen].movedim(0, 1)[None]
            values = pool.v[seen].movedim(0, 1)[None]
            query = q[row].view(heads, 1, dim)[None]
            want = scaled_dot_product_attention(query, keys, values, scale=layer.scaling,
                                                enable_gqa=True)  # fmt: skip
            torch.testing.assert_close(out[row].view(heads, dim), want[0, :, 0])


def test_one_step_eagle_tree_has_an_empty_parent_list():
    """--speculative-num-steps 1: the host passes no parents; every node hangs off the root."""
    bs, topk, n = 3, 1, 2
    parents = torch.empty((bs, 0), dtype=torch.int64)
    selected = torch.zeros((bs, n - 1), dtype=torch.int64)
    seq_lens = torch.tensor([5, 9, 2])
    mask = torch.zeros(bs * n * n, dtype=torch.bool)
    positions = torch.full((bs * n,), -5, dtype=torch.int64)
    retrive_index, next_token, next_sibling = (torch.full((bs, n), -1) for _ in range(3))
    ops.build_tree_kernel_efficient_cpu(
        parents, selected, seq_lens, mask, positions, retrive_index, next_token, next_sibling,
        topk, 1, n, 1,
    )  # fmt: skip
    assert positions.view(bs, n).tolist() == [[5, 6], [9, 10], [2, 3]]
    assert next_token.tolist() == [[1, -1]] * bs and next_sibling.tolist() == [[-1, -1]] * bs
    assert retrive_index.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert mask.view(bs, n, n).tolist() == [[[True, False], [True, True]]] * bs
