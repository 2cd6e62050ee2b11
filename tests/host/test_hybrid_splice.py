"""HYBRID's verify-row splice (sglang/verify/rows.py) against the host's tree layout.

The host's EAGLE tree builder (here the plugin's pure-torch ``build_tree_kernel_efficient``,
itself checked against the CUDA kernel's reference in tests/unit/test_cpu_fallback_ops.py)
writes a batch of trees into the verify input in each mask layout. Reading one request's
tree back from the host's links (``read_tree``) and splicing it into a copy whose row was
overwritten with garbage must restore exactly what the host wrote: tokens, tree mask
(prefix columns untouched), positions and links; the other rows stay as they were.
The verify input is a namespace with the host's field names (the real EagleVerifyInput is a
dataclass of the same tensors, built by the host only inside a running worker)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_spec_ext.replay.protocol import tree_from_ancestor_mask
from sglang_spec_ext.sglang.cpu.fallbacks import ops
from sglang_spec_ext.sglang.verify.rows import read_tree, write_trees
from sglang_spec_ext.verify.layout import retrieve_links, tree_mask
from tests.unit.test_cpu_fallback_ops import eagle_case


def _host_tree_batch(bs, topk, depth, n, mode, seed):
    parents, selected = eagle_case(bs, topk, depth, n, seed=seed)
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(1, 20, (bs,), generator=g)
    if mode == ops.FULL_MASK:
        mask = torch.ones(int(seq_lens.sum()) * n + bs * n * n, dtype=torch.bool)
    else:
        mask = torch.ones(bs * n * n, dtype=torch.bool)
    positions = torch.full((bs * n,), -5, dtype=torch.int64)
    idx, nxt, sib = (torch.full((bs, n), -1, dtype=torch.int64) for _ in range(3))
    ops.build_tree_kernel_efficient_cpu(
        parents, selected, seq_lens, mask, positions, idx, nxt, sib, topk, depth, n, mode
    )
    tokens = torch.randint(5, 1000, (bs * n,), generator=g)
    vi = SimpleNamespace(
        draft_token=tokens, custom_mask=mask, positions=positions, retrieve_index=idx,
        retrieve_next_token=nxt, retrieve_next_sibling=sib, spec_steps=depth,
    )  # fmt: skip
    return vi, seq_lens


def _clone(vi):
    return SimpleNamespace(
        **{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in vi.__dict__.items()}
    )


@pytest.mark.parametrize("mode", [ops.FULL_MASK, ops.QLEN_ONLY])
@pytest.mark.parametrize(("topk", "depth", "n"), [(1, 4, 5), (2, 3, 5), (4, 4, 8)])
def test_splicing_a_host_tree_back_restores_the_host_layout(mode, topk, depth, n):
    bs = 3
    host, seq_lens = _host_tree_batch(bs, topk, depth, n, mode, seed=7 * n + mode)
    batch = SimpleNamespace(seq_lens=seq_lens)
    checked = 0
    for row in range(bs):
        tok = host.draft_token.view(bs, n)[row].tolist()
        nt = host.retrieve_next_token[row].tolist()
        ns = host.retrieve_next_sibling[row].tolist()
        m_tokens, m_parents = read_tree(tok, nt, ns)
        if len(m_tokens) < n - 1:
            continue  # eagle_case's random selections can leave a node without its parent
        checked += 1
        spoiled = _clone(host)
        spoiled.draft_token.view(bs, n)[row, 1:] = 0
        spoiled.positions.view(bs, n)[row] = -7
        spoiled.retrieve_next_token[row] = 3
        spoiled.retrieve_next_sibling[row] = 2
        if mode == ops.QLEN_ONLY:
            spoiled.custom_mask.view(bs, n, n)[row] = True
        tokens = np.zeros((bs, n), dtype=np.int64)
        masks = np.zeros((bs, n, n), dtype=bool)
        tokens[row] = [tok[0], *m_tokens]
        masks[row] = tree_mask(m_parents, n)
        write_trees(spoiled, batch.seq_lens, [row], tokens, masks, mode)
        for name in ("draft_token", "custom_mask", "positions", "retrieve_next_token",
                     "retrieve_next_sibling", "retrieve_index"):  # fmt: skip
            assert torch.equal(getattr(spoiled, name), getattr(host, name)), (row, name)
    assert checked >= 1


def test_suffix_tree_with_padding_and_deeper_than_the_host_steps():
    """A suffix chain of 4 nodes in a width-6 row of a steps-2 tree batch: padded with a
    token-0 chain below its leaf, positions seq_len + depth, spec_steps raised."""
    n, bs = 6, 2
    vi, seq_lens = _host_tree_batch(bs, 2, 2, n, ops.QLEN_ONLY, seed=3)
    before = _clone(vi)
    parents = [-1, 0, 1, 2]
    tokens = np.zeros((bs, n), dtype=np.int64)
    masks = np.zeros((bs, n, n), dtype=bool)
    tokens[1, :5] = [999, 11, 12, 13, 14]  # the root is not written: the host's stays
    masks[1] = tree_mask(parents, n)
    write_trees(vi, seq_lens, [1], tokens, masks, ops.QLEN_ONLY)
    assert vi.draft_token[n:].tolist() == [before.draft_token[n].item(), 11, 12, 13, 14, 0]
    assert vi.positions[n:].tolist() == [int(seq_lens[1]) + d for d in range(n)]
    nt, ns = retrieve_links(tree_from_ancestor_mask(tokens[1], masks[1]).parents, n)
    assert vi.retrieve_next_token[1].tolist() == nt.tolist() == [1, 2, 3, 4, 5, -1]
    assert vi.retrieve_next_sibling[1].tolist() == ns.tolist()
    assert torch.equal(vi.custom_mask[: n * n], before.custom_mask[: n * n])  # row 0 untouched
    assert vi.spec_steps == n - 1


def test_model_tree_reads_any_tree_back_from_its_links():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        parents = [int(rng.integers(-1, i)) for i in range(n)]
        nt, ns = retrieve_links(parents, n + 1)
        tokens = list(range(100, 101 + n))
        got_tokens, got_parents = read_tree(tokens, nt.tolist(), ns.tolist())
        assert list(got_parents) == parents and list(got_tokens) == tokens[1:]


@pytest.mark.parametrize("mode", [ops.FULL_MASK, ops.QLEN_ONLY, ops.QLEN_ONLY_BITPACKING])
def test_wide_input_holds_every_row_at_the_wider_width(mode):
    """HYBRID's wide step (sglang/workers/hybrid_wide.py): the model's width-5 verify input
    rebuilt at width 9 from the rows the choice packed (request 0: its model tree as the
    host built it; request 1: a 7-node suffix chain). Each row's reachable tree, root, mask
    (prefix columns included), positions and links are those of its tree at width 9."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    from sglang_spec_ext.sglang.verify.wide_input import build_wide_input

    bs, n, wide = 2, 5, 9
    host, seq_lens = _host_tree_batch(bs, 2, 3, n, ops.QLEN_ONLY, seed=11)
    vi = SimpleNamespace(**host.__dict__, retrieve_cum_len=None, topk=2,
                         capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=None,
                         seq_lens_cpu=seq_lens.clone())  # fmt: skip
    batch = SimpleNamespace(seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone())
    rows = []
    m_tokens, m_parents = read_tree(host.draft_token.view(bs, n)[0].tolist(),
                                    host.retrieve_next_token[0].tolist(),
                                    host.retrieve_next_sibling[0].tolist())  # fmt: skip
    rows.append((list(m_tokens), list(m_parents)))
    rows.append(([21, 22, 23, 24, 25, 26, 27], [-1, 0, 1, 2, 3, 4, 5]))
    tokens = np.zeros((bs, wide), dtype=np.int64)
    masks = np.zeros((bs, wide, wide), dtype=bool)
    for b, (toks, pars) in enumerate(rows):
        tokens[b, 1 : 1 + len(toks)] = toks
        masks[b] = tree_mask(pars, wide)
    out = build_wide_input(vi, batch, tokens, masks, mode)
    assert isinstance(out, EagleVerifyInput) and out.draft_token_num == wide
    assert out.spec_steps >= 6 and out.topk == 2
    roots = host.draft_token.view(bs, n)[:, 0]
    assert torch.equal(out.draft_token.view(bs, wide)[:, 0], roots)
    for b, (toks, pars) in enumerate(rows):
        got = read_tree(out.draft_token.view(bs, wide)[b].tolist(),
                        out.retrieve_next_token[b].tolist(),
                        out.retrieve_next_sibling[b].tolist())  # fmt: skip
        # the tree, then the token-0 padding chained below its last node
        assert list(got[0][: len(toks)]) == toks and set(got[0][len(toks) :]) <= {0}
        assert list(got[1][: len(pars)]) == pars
        anc = tree_mask(pars, wide)
        depth = anc.sum(-1) - 1
        assert out.positions.view(bs, wide)[b].tolist() == (int(seq_lens[b]) + depth).tolist()
        if mode == ops.QLEN_ONLY:
            assert np.array_equal(out.custom_mask.view(bs, wide, wide)[b].numpy(), anc)
        elif mode == ops.FULL_MASK:
            start = wide * int(seq_lens[:b].sum()) + b * wide * wide
            own = int(seq_lens[b])
            rows_b = out.custom_mask[start : start + wide * (own + wide)].view(wide, own + wide)
            assert bool(rows_b[:, :own].all())  # every draft token sees the whole prefix
            assert np.array_equal(rows_b[:, own:].numpy(), anc)
        else:
            bits = out.custom_mask.view(bs, wide)[b].to(torch.int64)
            unpacked = (bits[:, None] >> torch.arange(wide)) & 1
            assert np.array_equal(unpacked.bool().numpy(), anc)
