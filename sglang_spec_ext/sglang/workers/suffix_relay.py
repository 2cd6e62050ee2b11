"""What a request has committed that ``req.output_ids`` does not hold yet (overlap relay).

Under overlap scheduling the host launches step N+1 before it has processed step N's
results on the host, so the tokens step N accepted are not yet in ``req.output_ids``:
they come with the batch, relayed by the host's future map (``batch.spec_info``'s
``accept_tokens`` / ``accept_lens``). The SUFFIX worker splices them in exactly as the
host's NGRAM worker does, to sync its drafter sessions (``suffix_sessions.py``) and to
root each draft tree at the request's last committed token. Without overlap (or where
a grammar makes the scheduler sync each step) there is nothing to splice.
"""

from __future__ import annotations

from typing import Any

import torch


def relayed_tokens(spec_info: Any, bs: int) -> tuple[list[int], list[int], int]:
    """The previous step's accepted tokens (overlap relay): ids, lengths, row stride.

    The stride is read from the relay itself (its rows are as wide as the host's
    future map, sized by the first relayed step), not from a width attribute that
    a batch made of merged or earlier steps may carry stale.
    """
    ids, lens = spec_info.accept_tokens, spec_info.accept_lens
    if not ids.is_cpu:  # one device-to-host copy (one sync) for both
        n = ids.numel()
        both = torch.cat([ids.reshape(-1), lens.reshape(-1).to(ids.dtype)]).cpu()
        ids, lens = both[:n], both[n:]
    ids, lens = ids.tolist(), lens.tolist()
    if len(lens) != bs or (bs and len(ids) % bs):
        raise RuntimeError(
            f"overlap relay does not match the batch: {len(lens)} accept lengths and "
            f"{len(ids)} tokens for {bs} requests"
        )
    stride = len(ids) // bs if bs else 0
    if lens and max(lens) > stride:
        raise RuntimeError(f"overlap relay: accept length {max(lens)} > row stride {stride}")
    return ids, lens, stride


def relayed_per_request(batch: Any, enable_overlap: bool) -> list[list[int]]:
    """Per request, the accepted tokens of the previous step not yet in
    ``req.output_ids``. Same splice rule as the host's NGRAM: only overlap mode has
    such tokens (relayed by the host's future map)."""
    bs = len(batch.reqs)
    if not enable_overlap or batch.grammar_needs_sync():
        return [[] for _ in range(bs)]
    ids, lens, stride = relayed_tokens(batch.spec_info, bs)
    return [ids[i * stride : i * stride + lens[i]] for i in range(bs)]


def last_token(req: Any, prev: list[int]) -> int:
    """The request's last committed token (``prev``: its relayed tokens): the root of
    its draft tree."""
    if prev:
        return prev[-1]
    out = req.output_ids
    return out[-1] if len(out) else req.origin_input_ids_unpadded[-1]
