"""The first decode batch of a PD decode server (``sglang/serving/disagg_decode.py``) against
the host's real ``FutureMap`` and ``NgramVerifyInput``: what SUFFIX's spec class relays,
and the host's own path for an NGRAM-shaped algorithm failing where ours does not.

The batch is a stand-in carrying the fields ``process_prebuilt`` hands the spec class (a
real prebuilt batch needs a transferred request: ``tests/e2e/test_pd_disaggregation.py``,
with ``--gpu-path overlap`` for the future-map branch)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.managers.overlap_utils import FutureMap, RelayPayload
from sglang.srt.runtime_context import get_context
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sglang_spec_ext.plugin import register

WIDTH = 8


@pytest.fixture
def suffix():
    register()
    with get_context().override_server_args(speculative_algorithm="SUFFIX",
                                            speculative_num_draft_tokens=WIDTH):  # fmt: skip
        yield SpeculativeAlgorithm.from_string("SUFFIX")


def _batch(overlap: bool) -> SimpleNamespace:
    return SimpleNamespace(reqs=[object()] * 3, device=torch.device("cpu"),
                           seq_lens=torch.tensor([5, 9, 7]), req_pool_indices=torch.tensor([2, 4, 6]),
                           enable_overlap=overlap)  # fmt: skip


def _future_map(algo) -> FutureMap:
    pool = SimpleNamespace(req_to_token=torch.zeros(8, 64, dtype=torch.int32))
    return FutureMap(torch.device("cpu"), algo, pool)


def test_the_first_decode_batch_relays_nothing_beyond_output_ids(suffix):
    batch, last = _batch(overlap=False), torch.tensor([11, 12, 13])
    info = suffix.build_disagg_draft_input(batch, last, _future_map(suffix))
    assert info.draft_token_num == WIDTH and info.future_indices is None
    assert info.accept_lens.tolist() == [0, 0, 0]  # the first token is in output_ids already
    rows = info.accept_tokens.view(3, WIDTH)
    assert rows[:, 0].tolist() == [11, 12, 13] and not rows[:, 1:].any()


def test_under_overlap_it_goes_through_the_future_map(suffix):
    batch, last, fmap = _batch(overlap=True), torch.tensor([11, 12, 13]), _future_map(suffix)
    info = suffix.build_disagg_draft_input(batch, last, fmap)
    assert info.future_indices.tolist() == [2, 4, 6]
    assert fmap.new_seq_lens_buf[info.future_indices].tolist() == [5, 9, 7]
    # what the next step's resolve_forward_inputs hands the worker
    nxt = SimpleNamespace(spec_info=SimpleNamespace(future_indices=info.future_indices))
    fmap._resolve_spec_extras(nxt)
    assert nxt.spec_info.accept_lens.tolist() == [0, 0, 0]
    assert nxt.spec_info.accept_tokens.view(3, WIDTH)[:, 0].tolist() == [11, 12, 13]


def test_the_hosts_own_path_fails_for_an_ngram_shaped_future_map(suffix):
    """Why the spec class answers: the host's fallback (a bonus-token payload) is what its
    NGRAM future map cannot take. If this stops failing, the host fixed it."""
    fmap = _future_map(suffix)
    with pytest.raises(AttributeError, match="shape"):
        fmap.stash(torch.tensor([2, 4, 6]), RelayPayload(bonus_tokens=torch.tensor([1, 2, 3])))
