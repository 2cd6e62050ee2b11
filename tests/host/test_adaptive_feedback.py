"""Adaptive SUFFIX's feedback (sglang/workers/adaptive_worker.py): each decode step's
accepted drafts come from the host's result processing on the CPU
(``on_verify_complete_cpu``, which the scheduler's ``batch_result_processor`` calls once
per speculative decode result), its time from the next decode step's start; the
controller gets a step once both are known, in order, under either scheduling order
(without overlap the result comes before the next step; with overlap after it). The
worker reads nothing from the device for it (before: ``accept_lens.tolist()`` at the
next step's start)."""

from __future__ import annotations

import pytest

from sglang_spec_ext.sglang.workers.adaptive_worker import (
    MAX_UNRESOLVED_STEPS,
    AdaptiveSuffixWorker,
    _Step,
)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_verify(self, bs, k, accepted, step_time, req_ids=None) -> None:
        self.calls.append((bs, k, list(accepted), step_time, list(req_ids)))


@pytest.fixture
def worker():
    from collections import deque

    w = object.__new__(AdaptiveSuffixWorker)  # its __init__ needs the scheduler's context
    w.controller = Recorder()
    w.adaptive_controller = None  # the host's own (NGRAMWorker.on_verify_complete_cpu)
    w._steps = deque(maxlen=MAX_UNRESOLVED_STEPS)
    w.feedback_mismatches = w.fed_back_steps = 0
    return w


def _launch(w, bs: int, k: int, start: float) -> None:
    """What forward_batch_generation does around a decode step of ``bs`` requests."""
    w._close_step(start, bs)
    w._steps.append(_Step(bs, k, [f"r{i}" for i in range(bs)], start))


def test_without_overlap_the_result_waits_for_the_next_steps_start(worker):
    _launch(worker, 2, 7, 10.0)
    worker.on_verify_complete_cpu([3, 0], batch_size=2)
    assert worker.controller.calls == []  # its time is not known yet
    _launch(worker, 2, 3, 10.5)
    assert worker.controller.calls == [(2, 7, [3, 0], pytest.approx(0.5), ["r0", "r1"])]


def test_with_overlap_the_next_step_starts_before_the_result(worker):
    _launch(worker, 2, 7, 10.0)
    _launch(worker, 2, 5, 10.4)  # step 2 launched before step 1's result is processed
    assert worker.controller.calls == []
    worker.on_verify_complete_cpu([1, 2], batch_size=2)
    _launch(worker, 2, 5, 10.9)
    worker.on_verify_complete_cpu([4, 4], batch_size=2)
    calls = worker.controller.calls
    assert [c[:4] for c in calls] == [(2, 7, [1, 2], pytest.approx(0.4)),
                                      (2, 5, [4, 4], pytest.approx(0.5))]  # fmt: skip


def test_a_prefill_or_another_batch_size_leaves_the_step_untimed_not_unheard(worker):
    _launch(worker, 2, 7, 10.0)
    worker._close_step(None)  # a prefill batch in between
    worker.on_verify_complete_cpu([2, 1], batch_size=2)
    _launch(worker, 3, 7, 11.0)
    worker.on_verify_complete_cpu([0, 0, 5], batch_size=3)
    _launch(worker, 2, 7, 11.2)  # another batch size: no step time for the bs-3 step
    assert [c[:4] for c in worker.controller.calls] == [(2, 7, [2, 1], None),
                                                        (3, 7, [0, 0, 5], None)]  # fmt: skip


def test_a_result_of_no_waiting_step_is_counted_and_the_queue_is_bounded(worker):
    worker.on_verify_complete_cpu([1], batch_size=1)  # nothing launched: no step to match
    _launch(worker, 2, 7, 10.0)
    worker.on_verify_complete_cpu([1, 1, 1], batch_size=3)  # not this step's shape
    assert worker.feedback_mismatches == 2 and worker.controller.calls == []
    for i in range(3 * MAX_UNRESOLVED_STEPS):  # results never come: old steps drop out
        _launch(worker, 2, 7, 11.0 + i)
    assert len(worker._steps) == MAX_UNRESOLVED_STEPS
