"""SUFFIX on the decode server of a prefill-decode pair: the first decode batch's draft input.

A request reaches the decode server with its prompt's KV already transferred and its first
output token, sampled by the prefill server, already appended to ``req.output_ids``
(``disaggregation/decode.py`` ``_commit_transfer_to_req``). The scheduler then builds a
"prebuilt" batch and asks the spec class for its draft input
(``SpeculativeAlgorithm.build_disagg_draft_input``, ``decode_schedule_batch_mixin.py``
``process_prebuilt``). SGLang 0.5.23 answers for EAGLE, DSPARK and DFLASH only; for an
NGRAM-shaped algorithm it stashes a bonus-token payload into the future map, whose NGRAM
buffers expect ``accept_tokens`` (``FutureMap.stash`` fails on it: the host's own NGRAM
cannot decode in a PD pair either).

:func:`build_suffix_disagg_draft_input` gives what the host's NGRAM extend step gives the
first decode step of a local request: an ``NgramVerifyInput`` whose relayed tokens are rows
as wide as the startup verify width (the future map's row stride), with the difference that
nothing is relayed (``accept_lens`` 0): the first token is in ``req.output_ids`` already,
not in flight. Under overlap scheduling it is published and stashed in the future map as
the host's EAGLE path does for its prebuilt batches.

The wire schema of the pair matches a prefill server without speculation: SUFFIX carries
no draft hidden states (the metadata buffers keep the host's 16-float padding row,
``scheduler.py``) and has no draft KV pool to transfer. The drafter needs nothing else from
the prefill server: the SUFFIX worker's session for a
request starts at its first decode step from ``req.origin_input_ids`` (the decode server
tokenizes the same request) and ``req.output_ids`` (``workers/suffix_sessions.py``), with
the request's tenant scope from its own ``cache_salt`` / ``extra_key`` / LoRA.
"""

from __future__ import annotations

from typing import Any

import torch


def build_suffix_disagg_draft_input(
    batch: Any, last_tokens_tensor: torch.Tensor, future_map: Any
) -> Any:
    """The draft input of a prebuilt (transferred) batch for an NGRAM-shaped worker."""
    from sglang.srt.managers.overlap_utils import RelayPayload
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.ngram_info import NgramVerifyInput

    width = int(get_spec().speculative_num_draft_tokens)
    bs = len(batch.reqs)
    accept_tokens = torch.zeros(bs, width, dtype=torch.int32, device=batch.device)
    accept_tokens[:, 0] = last_tokens_tensor.to(torch.int32)
    spec_info = NgramVerifyInput(
        draft_token_num=width,
        new_seq_lens=batch.seq_lens,
        accept_tokens=accept_tokens.flatten(),
        accept_lens=torch.zeros(bs, dtype=torch.int32, device=batch.device),
    )
    if batch.enable_overlap:
        spec_info.future_indices = batch.req_pool_indices
        future_map.publish(spec_info.future_indices, batch.seq_lens)
        future_map.stash(spec_info.future_indices, RelayPayload.from_ngram(spec_info))
    return spec_info
