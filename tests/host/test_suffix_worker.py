"""The SUFFIX worker's drafting and request bookkeeping on real host objects.

Uses the host's real ``Req`` objects and its real ``NGRAMWorker`` class. The batch
is a stand-in (a real ``ScheduleBatch`` needs allocated KV pools and a device);
it provides exactly what ``_prepare_draft_tokens`` reads.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.speculative.ngram_worker import NGRAMWorker

from sglang_spec_ext.sglang.workers.suffix_worker import SuffixWorker

WIDTH = 6


def _self_attrs(fn) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {
        t.attr
        for node in ast.walk(tree)
        for t in getattr(node, "targets", [getattr(node, "target", None)])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


def test_worker_sets_every_attribute_the_host_ngram_init_sets():
    host = _self_attrs(NGRAMWorker.__init__)
    ours = _self_attrs(SuffixWorker.__init__) | _self_attrs(SuffixWorker._init_drafter)
    assert len(host) > 10, "host NGRAMWorker.__init__ parsing found too little"
    missing = sorted(host - ours)
    assert not missing, f"host NGRAMWorker.__init__ sets attributes SuffixWorker lacks: {missing}"


def test_worker_overrides_only_the_draft_source():
    # The NGRAM methods we rely on must still exist in the host with these names.
    for name in (
        "_prepare_draft_tokens",
        "_update_ngram_corpus",
        "forward_batch_generation",
        "_prepare_for_speculative_decoding",
        "clear_cache_pool",
    ):
        assert callable(getattr(NGRAMWorker, name, None)), name
    # Our step only adds plain decode steps (no draft for any request of a batch,
    # plain_step.py); every other step is the host's NGRAM step. The forward around it adds
    # the recycled source's top-k tap after the step (suffix_sources.py).
    import inspect

    source = inspect.getsource(SuffixWorker._step)
    assert "return super().forward_batch_generation(batch, on_publish, pp_proxy_tensors)" in source
    outer = inspect.getsource(SuffixWorker.forward_batch_generation)
    assert "self._step(" in outer and "self._recycle_tap(" in outer


@pytest.fixture
def worker(monkeypatch):
    for k in list(__import__("os").environ):
        if k.startswith("SGLANG_SPEC_EXT_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("SGLANG_SPEC_EXT_MAX_CACHED_REQUESTS", "5")
    w = object.__new__(SuffixWorker)  # __init__ needs the host's runtime context
    w.draft_token_num = WIDTH
    w.enable_overlap = False
    w._init_drafter()
    return w


def _req(rid: str, prompt: list[int]) -> Req:
    return Req(rid, "", prompt, SamplingParams(max_new_tokens=64))


def _batch(reqs, spec_info=None):
    return SimpleNamespace(reqs=reqs, spec_info=spec_info, grammar_needs_sync=lambda: False)


def test_drafts_follow_the_request_and_use_the_host_layout(worker):
    pattern = [11, 12, 13, 14, 15]
    a, b = _req("a", pattern * 3), _req("b", [7, 8, 9])
    a.output_ids.extend([11, 12])
    b.output_ids.extend([3])
    tokens, mask = worker._prepare_draft_tokens(_batch([a, b]))
    assert tokens.shape == (2 * WIDTH,) and mask.shape == (2 * WIDTH * WIDTH,)
    tokens = tokens.reshape(2, WIDTH)
    assert tokens[0, 0] == 12 and tokens[1, 0] == 3  # roots: last committed tokens
    assert list(tokens[0, 1:4]) == [13, 14, 15]  # the repeated pattern is drafted
    m = mask.reshape(2, WIDTH, WIDTH)
    assert m[:, :, 0].all() and np.array_equal(
        np.diagonal(m, axis1=1, axis2=2), np.ones((2, WIDTH), bool)
    )
    # Newly committed tokens reach the drafter at the next step.
    a.output_ids.extend([13, 14, 15, 11])
    tokens, _ = worker._prepare_draft_tokens(_batch([a, b]))
    assert tokens[0] == 11 and list(tokens[1:4]) == [12, 13, 14]
    assert worker.drafter_stats()["sessions"] == 2


def test_overlap_mode_splices_previous_accepted_tokens(worker):
    worker.enable_overlap = True
    a = _req("a", [1, 2, 3, 4, 1, 2, 3, 4])
    a.output_ids.extend([1])
    prev = torch.zeros(WIDTH, dtype=torch.int64)
    prev[:2] = torch.tensor([2, 3])
    spec_info = SimpleNamespace(accept_tokens=prev, accept_lens=torch.tensor([2]))
    tokens, _ = worker._prepare_draft_tokens(_batch([a], spec_info))
    assert tokens[0] == 3 and tokens[1] == 4  # root is the spliced token; 4 follows 1,2,3
    assert worker._sessions["a"].synced == 3


def test_departed_requests_leave_nothing_behind_and_the_cache_stays_bounded(worker):
    for i in range(40):
        r = _req(f"r{i}", [i, i + 1, i + 2, i + 3] * 4)
        r.output_ids.extend([i, i + 1])
        worker._prepare_draft_tokens(_batch([r]))
        r.output_ids.extend([i + 2, i + 3])  # committed in the request's last step
        worker.ngram_corpus.erase_match_state([r.rid])  # what the host calls on departure
        stats = worker.drafter_stats()
        assert stats["sessions"] == 0 and stats["active_requests"] == 0
        assert stats["cached_requests"] <= 5
    assert worker.drafter_stats()["cached_requests"] == 5
    worker.ngram_corpus.reset()
    assert worker.drafter_stats()["cached_tokens"] == 0


def test_external_corpus_calls_reach_the_drafter(worker):
    """The host's ExternalCorpusManager calls: build (its loader thread), commit, list,
    remove; a refused corpus attaches nothing."""
    assert worker.list_external_corpora() == {}
    assert worker.add_external_corpus("c", [[1, 2, 3, 4]]) == 4
    assert worker.list_external_corpora() == {}  # built, not attached before the commit
    worker.commit_corpus_load("c", 4)
    assert worker.list_external_corpora() == {"c": 4}
    with pytest.raises(ValueError, match="not a token id"):
        worker.add_external_corpus("bad", [[1, -3]])
    worker.remove_external_corpus("c")
    with pytest.raises(ValueError, match="no external corpus"):
        worker.remove_external_corpus("c")
    assert worker.list_external_corpora() == {}


def test_draft_gate_turns_weak_steps_plain_and_learns_from_them(worker, monkeypatch):
    """SGLANG_SPEC_EXT_DRAFT_GATE=1 (suffix/gate.py) on the real worker's drafting: with
    a verify priced far above what the drafts are expected to gain, the step goes out
    with roots only (a plain step); the gated draft is walked over the tokens the request
    commits next, and a departed request leaves no gate state behind."""
    monkeypatch.setenv("SGLANG_SPEC_EXT_DRAFT_GATE", "1")
    monkeypatch.setenv("SGLANG_SPEC_EXT_DRAFT_GATE_COST", "100")
    worker._init_drafter()
    gate = worker._gate
    assert gate is not None
    a = _req("a", [11, 12, 13, 14, 15] * 3)
    a.output_ids.extend([11, 12])
    tokens, _ = worker._prepare_draft_tokens(_batch([a]))
    assert tokens[0] == 12 and not tokens[1:].any() and worker._step_empty
    assert gate.stats()["gate_steps_plain"] == 1 and gate.stats()["gate_walks"] == 1
    a.output_ids.extend([13])  # the plain step's token: the walk goes on
    worker._prepare_draft_tokens(_batch([a]))
    a.output_ids.extend([99])  # off the draft: the walk ends with one accepted token
    worker._prepare_draft_tokens(_batch([a]))
    assert sum(seen for seen, _ in gate._acc.values()) >= 1
    worker.ngram_corpus.erase_match_state(["a"])
    assert not gate._walks and not gate._verified
    assert worker.drafter_stats()["gate_steps_plain"] >= 1


def test_draft_gate_lets_drafts_through_where_verifying_costs_nothing(worker, monkeypatch):
    monkeypatch.setenv("SGLANG_SPEC_EXT_DRAFT_GATE", "1")
    monkeypatch.setenv("SGLANG_SPEC_EXT_DRAFT_GATE_COST", "0")
    worker._init_drafter()
    a = _req("a", [11, 12, 13, 14, 15] * 3)
    a.output_ids.extend([11, 12])
    tokens, _ = worker._prepare_draft_tokens(_batch([a]))
    assert list(tokens[1:4]) == [13, 14, 15] and not worker._step_empty
    assert worker._gate.stats()["gate_steps_verified"] == 1


def test_draft_gate_is_on_by_default_and_off_under_the_controller(worker, monkeypatch, caplog):
    """The product default is the gate on (the test bed turns it off elsewhere:
    tests/conftest.py); the controller picks widths itself, so an adaptive worker drops
    the gate, and warns only where SGLANG_SPEC_EXT_DRAFT_GATE=1 was asked for."""
    from sglang_spec_ext.sglang.workers.adaptive_worker import AdaptiveSuffixWorker

    monkeypatch.delenv("SGLANG_SPEC_EXT_DRAFT_GATE", raising=False)
    worker._init_drafter()
    assert worker._gate is not None
    monkeypatch.setenv("SGLANG_SPEC_EXT_DRAFT_GATE", "0")
    worker._init_drafter()
    assert worker._gate is None

    def adaptive_worker() -> AdaptiveSuffixWorker:
        w = object.__new__(AdaptiveSuffixWorker)
        w.draft_token_num = WIDTH
        w.enable_overlap = False
        w._init_drafter()
        return w

    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE", "1")
    monkeypatch.delenv("SGLANG_SPEC_EXT_DRAFT_GATE", raising=False)
    with caplog.at_level("WARNING", logger="sglang_spec_ext"):
        assert adaptive_worker()._gate is None
    assert "DRAFT_GATE=1 is ignored" not in caplog.text
    monkeypatch.setenv("SGLANG_SPEC_EXT_DRAFT_GATE", "1")
    with caplog.at_level("WARNING", logger="sglang_spec_ext"):
        assert adaptive_worker()._gate is None
    assert "DRAFT_GATE=1 is ignored" in caplog.text
