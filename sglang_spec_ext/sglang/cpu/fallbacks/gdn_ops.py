"""Pure-torch versions of the Gated DeltaNet (GDN) kernels of sgl-kernel's CPU build.

The host's GDN backend (``srt/layers/attention/linear/gdn_backend.py``, ``kernels/
gdn_triton.py``) binds these on its CPU engine: ``sgl_kernel.mamba``'s
``causal_conv1d_fn_cpu``, ``causal_conv1d_update_cpu`` and ``chunk_gated_delta_rule_cpu``,
and ``torch.ops.sgl_kernel``'s ``fused_gdn_gating_cpu`` and
``fused_sigmoid_gating_delta_rule_update_cpu``. Each function here takes the arguments the
host passes and computes what the host's Triton kernel of the same role computes
(``kernels/ops/mamba/causal_conv1d_triton.py``, ``kernels/ops/attention/linear/
fused_sigmoid_gating_recurrent.py``, ``fused_gdn_gating.py``, ``fla/chunk.py``), with the
same state layouts, which the pool shares with the commit after a verify:

* conv state ``[slots, dim, W - 1]``: the last ``W - 1`` inputs, oldest first;
* recurrent state ``[slots, HV, V, K]`` (the math's ``h`` is ``[K, V]``, stored transposed);
* verify scratch: conv windows ``[rows, steps, dim, W - 1]`` and states
  ``[rows, steps, HV, V, K]``, step ``t`` holding the state after draft token ``t``; a tree
  draft's token starts from its parent's state (``retrieve_parent_token``, which the conv
  update derives from ``retrieve_next_token`` / ``retrieve_next_sibling``).

The recurrence is computed token by token in float32 (the chunked form of the GPU
prefill is the same sum reordered). Loops run over requests and tokens, fine for the
CPU test bed's tiny models, not fast.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

PAD_SLOT_ID = -1


# -- gating ------------------------------------------------------------------------------
def _gate(
    A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, beta: float, threshold: float
) -> torch.Tensor:
    """``g = -exp(A_log) * softplus(a + dt_bias)`` (log decay per token and value head)."""
    x = a.float() + dt_bias.float()
    softplus = torch.where(beta * x <= threshold, torch.log1p(torch.exp(beta * x)) / beta, x)
    return -torch.exp(A_log.float()) * softplus


def fused_gdn_gating_cpu(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g, sigmoid(b))`` for ``a``, ``b`` of ``[T, HV]``, each ``[1, T, HV]`` float32."""
    g = _gate(A_log, a, dt_bias, beta, threshold)
    beta_out = torch.sigmoid(b.float()).to(b.dtype).float()
    return g.unsqueeze(0), beta_out.unsqueeze(0)


# -- the delta rule ----------------------------------------------------------------------
def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    """``[..., H, K]`` query/key heads repeated to the ``hv`` value heads (GQA groups)."""
    return x.repeat_interleave(hv // x.shape[-2], dim=-2) if x.shape[-2] != hv else x


def _delta_step(
    h: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    g: torch.Tensor, beta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """One token: ``h`` ``[HV, K, V]``, ``q``/``k`` ``[HV, K]``, ``v`` ``[HV, V]``, ``g``/``beta``
    ``[HV]``; returns the new state and the output ``[HV, V]``."""
    h = h * torch.exp(g)[:, None, None]
    v = (v - torch.einsum("hkv,hk->hv", h, k)) * beta[:, None]
    h = h + k[:, :, None] * v[:, None, :]
    return h, torch.einsum("hkv,hk->hv", h, q)


def _recurrence(
    h: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    l2norm: bool,
    parents: list[int] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One sequence of ``T`` tokens from state ``h`` (``[HV, K, V]`` float32): the outputs
    ``[T, HV, V]`` and the state after each token. With ``parents``, token ``t > 0`` starts
    from the state after token ``parents[t]`` (a tree draft), else from the previous one."""
    hv = v.shape[-2]
    q, k = _heads(q.float(), hv), _heads(k.float(), hv)
    if l2norm:
        q, k = _l2norm(q), _l2norm(k)
    q = q * scale
    outs, states = [], []
    for t in range(q.shape[0]):
        if parents is not None and t > 0:
            h = states[parents[t]]
        h, o = _delta_step(h, q[t], k[t], v[t].float(), g[t].float(), beta[t].float())
        outs.append(o)
        states.append(h)
    return torch.stack(outs) if outs else v.new_zeros((0, *v.shape[1:])).float(), states


def _load_state(pool: torch.Tensor, idx: int, shape: torch.Size) -> torch.Tensor:
    """The ``[HV, K, V]`` float32 state of pool slot ``idx`` (zeros for a padded row)."""
    if idx < 0:
        return torch.zeros(shape[0], shape[2], shape[1], dtype=torch.float32)
    return pool[idx].float().transpose(-1, -2)


def _store_state(pool: torch.Tensor, idx: int, h: torch.Tensor) -> None:
    pool[idx] = h.transpose(-1, -2).to(pool.dtype)


def _bounds(cu_seqlens: torch.Tensor | None, total: int) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, total)]
    cu = [int(c) for c in cu_seqlens.tolist()]
    return list(zip(cu[:-1], cu[1:], strict=True))


def fused_sigmoid_gating_delta_rule_update_cpu(
    *,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor,
    initial_state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    scale: float | None = None,
    is_kda: bool = False,
    disable_state_update: bool = False,
    intermediate_states_buffer: torch.Tensor | None = None,
    intermediate_state_indices: torch.Tensor | None = None,
    cache_steps: int | None = None,
    retrieve_parent_token: torch.Tensor | None = None,
    **_: Any,
) -> torch.Tensor:
    """Gating plus the delta rule over each sequence of ``cu_seqlens`` (decode: one token a
    request; target verify: the draft tokens). ``q``/``k`` ``[1, T, H, K]``, ``v``
    ``[1, T, HV, V]``, ``a``/``b`` ``[T, HV]``; returns ``[1, T, HV, V]`` in ``q``'s dtype.

    Request ``n`` starts from ``initial_state_source[initial_state_indices[n]]`` (zeros if
    negative) and writes its final state back unless ``disable_state_update``. With
    ``intermediate_states_buffer`` the state after each token ``t`` goes to
    ``buffer[intermediate_state_indices[n], t]``; with ``retrieve_parent_token``
    (``[N, T]``) token ``t > 0`` starts from its parent's state (tree verify)."""
    if is_kda:
        raise NotImplementedError("KDA gating has no CPU fallback (GDN only)")
    hv, kdim = v.shape[-2], k.shape[-1]
    scale = kdim**-0.5 if scale is None else scale
    qs, ks, vs = (
        q.reshape(-1, *q.shape[-2:]),
        k.reshape(-1, *k.shape[-2:]),
        v.reshape(-1, hv, v.shape[-1]),
    )
    a2, b2 = a.reshape(-1, hv), b.reshape(-1, hv)
    g = _gate(A_log, a2, dt_bias, softplus_beta, softplus_threshold)
    beta = torch.sigmoid(b2.float())
    out = torch.zeros(vs.shape, dtype=torch.float32)
    indices = initial_state_indices.tolist()
    rows = None if intermediate_states_buffer is None else intermediate_state_indices.tolist()
    for n, (bos, eos) in enumerate(_bounds(cu_seqlens, vs.shape[0])):
        idx = int(indices[n])
        h0 = _load_state(initial_state_source, idx, initial_state_source.shape[1:])
        parents = None
        if retrieve_parent_token is not None:
            parents = [int(p) for p in retrieve_parent_token[n, : eos - bos].tolist()]
        sl = slice(bos, eos)
        o, states = _recurrence(h0, qs[sl], ks[sl], vs[sl], g[sl], beta[sl], scale,
                                use_qk_l2norm_in_kernel, parents)  # fmt: skip
        out[sl] = o
        if rows is not None and int(rows[n]) >= 0:
            for t, h in enumerate(states):
                intermediate_states_buffer[int(rows[n]), t] = h.transpose(-1, -2).to(
                    intermediate_states_buffer.dtype
                )
        if not disable_state_update and idx >= 0 and states:
            _store_state(initial_state_source, idx, states[-1])
    return out.to(q.dtype).reshape(1, *vs.shape)


def chunk_gated_delta_rule_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    head_first: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    initial_state_indices: torch.Tensor | None = None,
    scale: float | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor, None]:
    """The prefill delta rule with precomputed gates (``g``, ``beta`` ``[1, T, HV]``): each
    sequence of ``cu_seqlens`` from ``initial_state[initial_state_indices[n]]``, its final
    state written back there. Returns ``(o [1, T, HV, V], final states [N, HV, V, K], None)``."""
    if head_first:
        raise NotImplementedError("head_first=True has no CPU fallback")
    hv = v.shape[-2]
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    qs, ks, vs = q[0], k[0], v[0]
    gs, bs = g.reshape(-1, hv), beta.reshape(-1, hv)
    out = torch.zeros(vs.shape, dtype=torch.float32)
    spans = _bounds(cu_seqlens, vs.shape[0])
    indices = (
        list(range(len(spans))) if initial_state_indices is None else initial_state_indices.tolist()
    )
    finals = []
    for n, (bos, eos) in enumerate(spans):
        idx = int(indices[n])
        h = _load_state(initial_state, idx, initial_state.shape[1:])
        sl = slice(bos, eos)
        o, states = _recurrence(h, qs[sl], ks[sl], vs[sl], gs[sl], bs[sl], scale,
                                use_qk_l2norm_in_kernel)  # fmt: skip
        out[sl] = o
        h = states[-1] if states else h
        if idx >= 0:
            _store_state(initial_state, idx, h)
        finals.append(h.transpose(-1, -2))
    final = torch.stack(finals).to(initial_state.dtype) if finals else initial_state[:0]
    return out.to(q.dtype).unsqueeze(0), final, None


# -- the causal conv1d -------------------------------------------------------------------
def _activate(x: torch.Tensor, activation: Any) -> torch.Tensor:
    if activation in (True, "silu", "swish"):
        return F.silu(x)
    return x


def causal_conv1d_fn_cpu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens_cpu: Any = None,
    cache_indices: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
    activation: Any = "silu",
    pad_slot_id: int = PAD_SLOT_ID,
    **_: Any,
) -> torch.Tensor:
    """The prefill conv over ``x`` ``[dim, T]`` (sequences by ``query_start_loc``): each
    sequence continues ``conv_states[cache_indices[n]]`` where ``has_initial_state[n]``
    (zeros otherwise) and leaves its last ``W - 1`` inputs there. Returns ``[dim, T]``."""
    width = weight.shape[1]
    out = torch.zeros_like(x)
    spans = _bounds(query_start_loc, x.shape[1])
    for n, (bos, eos) in enumerate(spans):
        idx = n if cache_indices is None else int(cache_indices[n])
        if idx == pad_slot_id:
            continue
        init = has_initial_state is None or bool(has_initial_state[n])
        prev = conv_states[idx] if init else torch.zeros_like(conv_states[idx])
        xs = torch.cat([prev[:, -(width - 1) :].to(x.dtype), x[:, bos:eos]], dim=1)
        y = F.conv1d(xs.float().unsqueeze(0), weight.float().unsqueeze(1),
                     None if bias is None else bias.float(), groups=xs.shape[0])[0]  # fmt: skip
        out[:, bos:eos] = _activate(y, activation).to(x.dtype)
        conv_states[idx] = xs[:, -(width - 1) :].to(conv_states.dtype)
    return out


def _tree_parents(next_token: torch.Tensor, next_sibling: torch.Tensor, steps: int) -> list[int]:
    """Each draft token's parent step from its tree's first-child and next-sibling links
    (the host's conv kernel's order: token ``t``'s child gets parent ``t``, its next sibling
    gets ``t``'s parent); token 0 and unlinked (padding) tokens get 0."""
    nxt, sib = next_token.tolist(), next_sibling.tolist()
    parents = [0] * steps
    for t in range(steps):
        child, brother = int(nxt[t]), int(sib[t])
        if 0 <= child < steps:
            parents[child] = t
        if 0 <= brother < steps:
            parents[brother] = parents[t]
    return parents


def causal_conv1d_update_cpu(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: Any = None,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
    num_accept_tokens: torch.Tensor | None = None,
    intermediate_conv_window: torch.Tensor | None = None,
    intermediate_state_indices: torch.Tensor | None = None,
    retrieve_next_token: torch.Tensor | None = None,
    retrieve_next_sibling: torch.Tensor | None = None,
    retrieve_parent_token: torch.Tensor | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    **_: Any,
) -> torch.Tensor:
    """The decode / verify conv: ``x`` ``[B, dim]`` or ``[B, dim, T]``, request ``b`` on
    ``conv_state[conv_state_indices[b]]`` (skipped where it is ``pad_slot_id``). Each
    token's window is its last ``W`` inputs along its path (the previous token's, or with
    ``retrieve_next_token`` its tree ancestors', then the state; earlier tokens rounded to
    the state's dtype, as token-by-token decoding stores them). The state then holds the
    last ``W - 1`` inputs of the chain (a verify's commit overwrites it); with
    ``intermediate_conv_window`` the window after each token ``t`` (its last ``W - 1``
    inputs) goes to ``[intermediate_state_indices[b], t]``, and ``retrieve_parent_token``
    receives the parents. Returns ``x``'s shape."""
    if cache_seqlens is not None or num_accept_tokens is not None:
        raise NotImplementedError("circular conv states have no CPU fallback")
    squeeze = x.dim() == 2
    xs3 = x.unsqueeze(-1) if squeeze else x
    batch, _dim, steps = xs3.shape
    width = weight.shape[1]
    out = torch.zeros_like(xs3)
    w, bias_f = weight.float(), None if bias is None else bias.float()
    for bi in range(batch):
        idx = bi if conv_state_indices is None else int(conv_state_indices[bi])
        if idx == pad_slot_id:
            continue
        prev = conv_state[idx][:, -(width - 1) :].float()
        tokens = xs3[bi].float()
        # an earlier draft token enters a window as decoding would have stored it: in the
        # conv state's dtype (bf16 by default), so a verify equals token-by-token decode
        stored = tokens.to(conv_state.dtype).float()
        if retrieve_next_token is not None:
            parents = _tree_parents(retrieve_next_token[bi], retrieve_next_sibling[bi], steps)
            if retrieve_parent_token is not None:
                retrieve_parent_token[bi, :steps] = torch.tensor(parents)
        else:
            parents = [max(t - 1, 0) for t in range(steps)]
        row = None
        if intermediate_conv_window is not None:
            row = bi if intermediate_state_indices is None else int(intermediate_state_indices[bi])
        for t in range(steps):
            path, node = [t], t
            while node > 0 and len(path) < width:
                node = parents[node]
                path.append(node)
            cols = [stored[:, p] for p in reversed(path[1:])] + [tokens[:, t]]
            window = torch.cat([prev, torch.stack(cols, dim=1)], dim=1)[:, -width:]
            y = (window * w).sum(-1) + (0 if bias_f is None else bias_f)
            out[bi, :, t] = _activate(y, activation).to(x.dtype)
            if row is not None and row >= 0:
                intermediate_conv_window[row, t] = window[:, 1:].to(intermediate_conv_window.dtype)
        chain = torch.cat([prev, tokens], dim=1)
        conv_state[idx][:, -(width - 1) :] = chain[:, -(width - 1) :].to(conv_state.dtype)
    return out.squeeze(-1) if squeeze else out


# -- the commit after a verify -----------------------------------------------------------
def mamba_state_scatter_with_mask(
    dst: torch.Tensor,
    src: torch.Tensor,
    dst_indices_raw: torch.Tensor,
    step_indices_raw: torch.Tensor,
    src_indices_raw: torch.Tensor | None = None,
) -> None:
    """``dst[:, dst_indices_raw[i]] = src[:, row_i, step_indices_raw[i]]`` for every ``i``
    whose step is ``>= 0`` (``row_i``: ``src_indices_raw[i]``, or ``i``); all layers at
    once. The host's Triton ``fused_mamba_state_scatter_with_mask`` and
    ``fused_conv_window_scatter_with_mask`` (``dst`` ``[layers, slots, ...]``, ``src``
    ``[layers, rows, steps, ...]``), which refuse CPU tensors."""
    steps = step_indices_raw.reshape(-1).to(torch.int64)
    keep = torch.nonzero(steps >= 0).reshape(-1)
    if keep.numel() == 0:
        return
    dst_idx = dst_indices_raw.reshape(-1).to(torch.int64)[keep]
    rows = keep if src_indices_raw is None else src_indices_raw.reshape(-1).to(torch.int64)[keep]
    dst[:, dst_idx] = src[:, rows, steps[keep]].to(dst.dtype)
