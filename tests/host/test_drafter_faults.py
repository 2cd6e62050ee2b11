"""Drafter faults degrade one step of one request to plain decoding; serving goes on.

Real host ``Req`` objects and the real SUFFIX worker and drafter; faults are injected
by replacing drafter methods on the worker's drafter instance. The batch is a stand-in
(a real ``ScheduleBatch`` needs allocated KV pools) holding what drafting reads.
"""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import numpy as np
import pytest
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_params import SamplingParams

from sglang_spec_ext.sglang.workers.suffix_worker import SuffixWorker

WIDTH = 6
ERRORS = (RuntimeError, MemoryError, IndexError)
PATTERN = [11, 12, 13, 14, 15]


@pytest.fixture
def worker(monkeypatch):
    for k in list(os.environ):
        if k.startswith("SGLANG_SPEC_EXT_"):
            monkeypatch.delenv(k)
    w = object.__new__(SuffixWorker)  # __init__ needs the host's runtime context
    w.draft_token_num = WIDTH
    w.enable_overlap = False
    w._init_drafter()
    return w


def _reqs() -> list[Req]:
    reqs = []
    for rid in ("a", "b", "c"):
        r = Req(rid, "", PATTERN * 3, SamplingParams(max_new_tokens=64))
        r.output_ids.extend([11, 12])
        reqs.append(r)
    return reqs


def _batch(reqs):
    return SimpleNamespace(reqs=reqs, spec_info=None, grammar_needs_sync=lambda: False)


def _fail_for(drafter, name: str, rid: str, exc: type[BaseException], after: bool = False):
    """Make ``drafter.<name>`` raise ``exc`` whenever it is called for ``rid``."""
    original = getattr(drafter, name)

    def faulty(*args, **kwargs):
        ids = args[0] if args else kwargs.get("req_ids") or kwargs.get("req_id")
        hit = rid in ids if isinstance(ids, list) else ids == rid
        if hit and not after:
            raise exc(f"injected {name} fault")
        out = original(*args, **kwargs)
        if hit:
            raise exc(f"injected {name} fault")
        return out

    setattr(drafter, name, faulty)
    return original


def _rows(tokens: np.ndarray) -> np.ndarray:
    return tokens.reshape(-1, WIDTH)


def _assert_plain_row(tokens: np.ndarray, mask: np.ndarray, b: int, root: int) -> None:
    """Row ``b`` is an empty draft: the root, then the padding chain of token 0."""
    row = _rows(tokens)[b]
    assert row[0] == root and (row[1:] == 0).all()


@pytest.mark.parametrize("exc", ERRORS)
@pytest.mark.parametrize(
    "method,after",
    [
        ("start_request", False),
        ("start_request", True),
        ("extend_request", False),
        ("extend_request", True),
        ("speculate_batch", False),
    ],
)
def test_a_drafting_fault_plain_decodes_that_request_and_recovers(worker, method, after, exc):
    reqs = _reqs()
    if method == "speculate_batch":
        # the batched call fails for everyone, the per-request retry only for "b"
        _fail_for(worker.drafter, "speculate_batch", "b", exc)
        original = _fail_for(worker.drafter, "speculate", "b", exc)
    else:
        original = _fail_for(worker.drafter, method, "b", exc, after=after)
    tokens, mask = worker._prepare_draft_tokens(_batch(reqs))
    _assert_plain_row(tokens, mask, 1, root=12)
    for b in (0, 2):  # the others still draft the repeated pattern
        assert list(_rows(tokens)[b][:4]) == [12, 13, 14, 15]
    stats = worker.drafter_stats()
    assert stats["draft_faults"] >= 1 and "b" not in worker._sessions

    # The fault goes away: "b"'s session restarts from its whole history.
    setattr(worker.drafter, method, original)
    if method == "speculate_batch":
        del worker.drafter.speculate_batch, worker.drafter.speculate
    for r in reqs:
        r.output_ids.extend([13, 14])
    tokens, _ = worker._prepare_draft_tokens(_batch(reqs))
    for b in range(3):
        assert list(_rows(tokens)[b][:4]) == [14, 15, 11, 12]
    assert worker._sessions["b"].synced == 4


@pytest.mark.parametrize("exc", ERRORS)
def test_a_fault_when_a_request_leaves_is_absorbed(worker, exc):
    reqs = _reqs()
    worker._prepare_draft_tokens(_batch(reqs))
    reqs[1].output_ids.extend([13])
    _fail_for(worker.drafter, "finish_request", "b", exc)
    worker.ngram_corpus.erase_match_state(["b"])  # what the host calls on departure
    assert "b" not in worker._sessions and "b" not in worker.drafter
    assert worker.drafter_stats()["draft_faults_by_stage"] == {"close": 1}
    tokens, _ = worker._prepare_draft_tokens(_batch([reqs[0], reqs[2]]))
    assert list(_rows(tokens)[0][:4]) == [12, 13, 14, 15]


def test_a_drafter_that_cannot_drop_a_request_is_reset(worker, caplog):
    reqs = _reqs()
    worker._prepare_draft_tokens(_batch(reqs))
    _fail_for(worker.drafter, "extend_request", "b", MemoryError)
    _fail_for(worker.drafter, "abort_request", "b", RuntimeError)
    for r in reqs:
        r.output_ids.extend([13])
    with caplog.at_level(logging.WARNING, logger="sglang_spec_ext"):
        tokens, _ = worker._prepare_draft_tokens(_batch(reqs))
    assert "drafter reset" in caplog.text
    # The drafter was emptied: "a" (synced before the reset) and "b" plain-decode this
    # step, "c" already starts a new session; then everyone is back.
    for b in range(2):
        _assert_plain_row(tokens, None, b, root=13)
    assert list(_rows(tokens)[2][:3]) == [13, 14, 15]
    stats = worker.drafter_stats()
    assert stats["draft_faults_by_stage"]["abort"] == 1 and stats["active_requests"] == 1
    del worker.drafter.extend_request, worker.drafter.abort_request
    tokens, _ = worker._prepare_draft_tokens(_batch(reqs))
    assert all(list(_rows(tokens)[b][:3]) == [13, 14, 15] for b in range(3))


def test_faults_are_logged_once_per_request_and_counted_every_time(worker, caplog):
    reqs = _reqs()
    _fail_for(worker.drafter, "start_request", "b", IndexError)
    with caplog.at_level(logging.WARNING, logger="sglang_spec_ext"):
        for _ in range(5):
            worker._prepare_draft_tokens(_batch(reqs))
    lines = [r for r in caplog.records if "drafter fault" in r.getMessage()]
    assert len(lines) == 1 and "request b" in lines[0].getMessage()
    assert "IndexError" in lines[0].getMessage()
    assert worker.drafter_stats()["draft_faults"] == 5


def test_fault_log_lines_are_rate_limited(worker, caplog, monkeypatch):
    from sglang_spec_ext.sglang.workers import fault_log

    monkeypatch.setattr(fault_log, "FAULT_LOG_BURST", 3)
    reqs = [Req(f"r{i}", "", [1, 2, 3], SamplingParams(max_new_tokens=8)) for i in range(8)]

    def always(*a, **k):
        raise RuntimeError("injected")

    worker.drafter.start_request = always
    with caplog.at_level(logging.WARNING, logger="sglang_spec_ext"):
        tokens, _ = worker._prepare_draft_tokens(_batch(reqs))
    assert len([r for r in caplog.records if "drafter fault" in r.getMessage()]) == 3
    assert worker.drafter_stats()["draft_faults"] == 8
    assert [int(t) for t in _rows(tokens)[:, 0]] == [3] * 8


def test_a_malformed_draft_is_replaced_by_an_empty_one(worker):
    from sglang_spec_ext.suffix.draft import DraftTree

    reqs = _reqs()
    original = worker.drafter.speculate_batch
    worker._recycler = None  # the merge with recycled drafts would cut the tree to width

    def too_wide(rids, max_nodes):
        trees = original(rids, max_nodes)
        trees[1] = DraftTree(tokens=[1] * WIDTH, parents=list(range(-1, WIDTH - 1)))
        return trees

    worker.drafter.speculate_batch = too_wide
    tokens, _ = worker._prepare_draft_tokens(_batch(reqs))
    _assert_plain_row(tokens, None, 1, root=12)
    assert list(_rows(tokens)[0][:4]) == [12, 13, 14, 15]
    assert worker.drafter_stats()["draft_faults_by_stage"]["pack"] == 2


def test_drafter_stats_are_logged_as_json_for_the_soak_harness(worker, caplog, monkeypatch):
    import json

    from sglang_spec_ext.sglang.workers import suffix_sessions
    from sglang_spec_ext.soak.runner import DRAFTER_STATS_MARK

    assert suffix_sessions.STATS_LOG_MARK == DRAFTER_STATS_MARK
    reqs = _reqs()
    _fail_for(worker.drafter, "start_request", "b", RuntimeError)
    with caplog.at_level(logging.INFO, logger="sglang_spec_ext"):
        worker._prepare_draft_tokens(_batch(reqs))  # logs at the first step
        worker._prepare_draft_tokens(_batch(reqs))  # not again within the interval
        monkeypatch.setattr(worker, "_stats_log_interval_s", 0.0)
        worker._prepare_draft_tokens(_batch(reqs))
    lines = [r.getMessage() for r in caplog.records if DRAFTER_STATS_MARK in r.getMessage()]
    assert len(lines) == 2
    stats = json.loads(lines[-1].split(DRAFTER_STATS_MARK, 1)[1])
    assert stats["draft_faults"] == 2 and stats["sessions"] == 2
