"""HYBRID's record of committed tokens (sglang/workers/hybrid_commits.py), step by step.

What reaches the suffix sessions must be every committed token in order, whether the
request's ``output_ids`` is complete (no overlap) or one step behind (overlap), and a
record that disagrees with ``output_ids`` must give way to it. Tensors here are CPU
tensors; on a GPU the same code keeps them on the device until the packed read.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_spec_ext.sglang.workers.hybrid_commits import (
    MAX_UNREAD,
    CommitLog,
    StepRows,
    read_packed,
)


def test_read_packed_returns_every_tensor_exactly():
    ints = torch.tensor([[1, -2, 3], [2**40, 5, 6]], dtype=torch.int64)
    small = torch.tensor([7, 8], dtype=torch.int32)
    floats = torch.tensor([[0.1, -3.5e-8], [float("inf"), 1.0]], dtype=torch.float32)
    out = read_packed([ints, floats, small])
    assert [a.shape for a in out] == [(2, 3), (2, 2), (2,)]
    np.testing.assert_array_equal(out[0], ints.numpy())
    np.testing.assert_array_equal(out[1], floats.numpy())  # bit-exact, inf included
    assert out[1].dtype == np.float32 and out[0].dtype == np.int64
    np.testing.assert_array_equal(out[2], [7, 8])
    assert read_packed([]) == []


def _step(log, rids, starts, rows, lens, extra=None):
    width = max(len(r) for r in rows)
    tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    log.stash(StepRows(list(rids), list(starts), tokens, torch.tensor(lens), extra))


def _read(log):
    return log.apply(read_packed(log.unread_tensors()))


@pytest.mark.parametrize("lag", [False, True])
def test_committed_tokens_with_and_without_the_overlap_lag(lag):
    """Prefill, then three verify steps of one request. Under overlap the scheduler has
    not yet put the request's last step (the prefill's token, then each verify's) into
    output_ids when the next step drafts; the log supplies exactly those tokens."""
    log = CommitLog(keep=8)
    _step(log, ["a"], [0], [[10]], [1])
    committed, last = [10], [10]
    for toks in ([11, 12], [13], [14, 15, 16]):
        _read(log)
        out = committed[: len(committed) - len(last)] if lag else list(committed)
        total, beyond, resynced = log.committed("a", out)
        assert not resynced and total == len(committed)
        assert out + beyond == committed
        assert log.start_of("a", out) == total
        _step(log, ["a"], [total], [toks + [99]], [len(toks)])  # 99: a rejected draft slot
        committed, last = committed + toks, toks
    _read(log)
    assert log.committed("a", committed[:-3] if lag else committed) == (
        7, [14, 15, 16] if lag else [], False)  # fmt: skip


def test_a_record_that_disagrees_with_output_ids_gives_way():
    log = CommitLog(keep=8)
    _step(log, ["a"], [0], [[10]], [1])
    _read(log)
    _step(log, ["a"], [1], [[11, 12]], [2])
    _read(log)
    assert log.committed("a", [10]) == (3, [11, 12], False)
    # output_ids caught up with a different token: output_ids is the truth
    assert log.committed("a", [10, 11, 77]) == (3, [], True)
    assert log.resyncs == 1
    # a gap (tokens the log never saw): output_ids again
    assert log.committed("a", [10, 11, 77, 78, 79]) == (5, [], True)
    # a request the log never saw starts from output_ids, not counted as a resync
    assert log.committed("b", [5, 6]) == (2, [], False)
    assert log.resyncs == 2


def test_chunked_rows_skipped_sources_returned_and_bounds():
    log = CommitLog(keep=4)
    _step(log, ["a", None], [0, 0], [[10], [20]], [1, 1])  # the second is mid-chunk
    _step(log, ["a"], [1], [[11, 12, 13, 14, 15, 16]], [6], extra=["suffix"])
    steps = _read(log)
    assert [s.extra for s in steps] == [None, ["suffix"]]
    assert steps[1].host_lens.tolist() == [6]
    # six tokens beyond output_ids but only four kept: output_ids is the truth again
    assert log.committed("a", [10]) == (1, [], True)
    assert len(log) == 1
    for i in range(MAX_UNREAD + 5):  # prefills with no decode step between them
        _step(log, [f"r{i}"], [0], [[i]], [1])
    assert len(log.unread_tensors()) == 2 * MAX_UNREAD and log.dropped_steps == 5
    _read(log)
    log.keep_only({"r30"}, bound=10)
    assert len(log) == 1
    log.forget(["r30"])
    assert len(log) == 0
